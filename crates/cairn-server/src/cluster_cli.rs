//! `cairn cluster …`: status and membership changes through any member's peer port.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cairn_proto::cairn_v1 as pb;
use serde_json::json;

use crate::config::cluster_secret;
use crate::peer::PeerClient;

/// Default peer endpoint of `cairn cluster` (a local node's peer port).
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:5006";

/// Flags of `cairn cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Peer address (host:port) of any member; changes are carried out by the leader.
    #[arg(long, env = "CAIRN_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub endpoint: String,

    /// The cluster secret (as given to the nodes).
    #[arg(
        long,
        env = "CAIRN_CLUSTER_SECRET",
        hide_env_values = true,
        global = true
    )]
    pub cluster_secret: Option<String>,

    /// File holding the cluster secret.
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE", global = true)]
    pub cluster_secret_file: Option<PathBuf>,

    /// PEM certificate of the cluster's CA: speak mutual TLS to a peer port that serves
    /// it (the nodes' --peer-tls-ca). Inside a node's pod the node's own variables apply.
    #[arg(long, alias = "peer-tls-ca", env = "CAIRN_PEER_TLS_CA", global = true, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,

    /// PEM certificate this command presents, issued by the cluster's CA (a node's peer
    /// certificate will do: peer ports take only certificates of their CA).
    #[arg(
        long,
        alias = "peer-tls-cert",
        env = "CAIRN_PEER_TLS_CERT",
        global = true,
        requires = "tls_ca"
    )]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(
        long,
        alias = "peer-tls-key",
        env = "CAIRN_PEER_TLS_KEY",
        global = true,
        requires = "tls_ca"
    )]
    pub tls_key: Option<PathBuf>,

    /// Name the endpoint's certificate must carry, when it is not the --endpoint host (a
    /// node's DNS name when reaching it at 127.0.0.1).
    #[arg(
        long,
        env = "CAIRN_TLS_SERVER_NAME",
        global = true,
        requires = "tls_ca"
    )]
    pub tls_server_name: Option<String>,

    /// Print one JSON object instead of text.
    #[arg(long, env = "CAIRN_OUTPUT_JSON", global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub action: ClusterAction,
}

/// `cairn cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterAction {
    /// The endpoint node's view: role, term, leader, members, log indexes, followers'
    /// progress, boundaries' last positions.
    Status,
    /// Add a node as a learner (it replicates without voting), e.g. one started with --join.
    AddLearner {
        /// Raft id of the new node.
        node_id: u64,
        /// Its peer address (host:port).
        address: String,
    },
    /// Make a caught-up learner a voter.
    Promote {
        /// Raft id of the learner.
        node_id: u64,
    },
    /// Remove a voter or learner from the membership (stop its process afterwards).
    Remove {
        /// Raft id of the node.
        node_id: u64,
    },
    /// Hand leadership to another voter that has caught up.
    TransferLeader {
        /// Raft id of the voter that should lead.
        node_id: u64,
    },
    /// Recovery when a majority of voters lost their state: let the --endpoint node (one
    /// that lost it, standing "rejoining") vote for one survivor, whose log becomes the
    /// group's. Writes acknowledged only by the nodes that lost their state are gone: pick
    /// the survivor with the highest last log index. Send it to each node that lost its
    /// state; they rejoin as voters once the survivor leads.
    AllowVote {
        /// Raft id of the surviving voter.
        candidate_id: u64,
    },
}

/// The TLS of `--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-server-name`.
fn dial_tls(args: &ClusterArgs) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    let (Some(ca), Some(cert), Some(key)) = (&args.tls_ca, &args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    crate::client_cli::dial_tls(ca, Some((cert, key)), args.tls_server_name.as_deref()).map(Some)
}

fn describe(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Runs a `cairn cluster` subcommand and prints its result.
pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let secret = cluster_secret(
        args.cluster_secret.as_deref(),
        args.cluster_secret_file.as_deref(),
    )?
    .context("the cluster API needs --cluster-secret or --cluster-secret-file")?;
    let mut peers = PeerClient::new(Some(&secret), None).map_err(anyhow::Error::msg)?;
    if let Some(tls) = dial_tls(&args)? {
        peers = peers.with_fixed_tls(tls);
    }
    let endpoint = &args.endpoint;
    let mut client = peers
        .cluster(endpoint)
        .map_err(|s| anyhow::anyhow!("{}", describe(&s)))?;
    let plaintext = args.tls_ca.is_none();
    let failed = |s: tonic::Status| {
        let hint = if plaintext && crate::client_cli::met_a_tls_port(&s) {
            " (if its peer port speaks TLS, pass --tls-ca, --tls-cert and --tls-key)"
        } else {
            ""
        };
        anyhow::anyhow!("{endpoint}: {}{hint}", describe(&s))
    };
    match args.action {
        ClusterAction::Status => {
            let status = client
                .status(peers.cluster_request(pb::StatusRequest {}))
                .await
                .map_err(failed)?
                .into_inner();
            if args.json {
                println!("{}", status_json(&status));
            } else {
                print!("{}", status_text(&status));
            }
        }
        ClusterAction::AddLearner { node_id, address } => {
            let reply = client
                .add_learner(peers.cluster_request(pb::AddLearnerRequest { node_id, address }))
                .await
                .map_err(failed)?
                .into_inner();
            print_members(
                &format!("node {node_id} added as a learner"),
                &reply,
                args.json,
            );
        }
        ClusterAction::Promote { node_id } => {
            let reply = client
                .promote(peers.cluster_request(pb::PromoteRequest { node_id }))
                .await
                .map_err(failed)?
                .into_inner();
            print_members(&format!("node {node_id} is a voter"), &reply, args.json);
        }
        ClusterAction::Remove { node_id } => {
            let reply = client
                .remove_node(peers.cluster_request(pb::RemoveNodeRequest { node_id }))
                .await
                .map_err(failed)?
                .into_inner();
            print_members(&format!("node {node_id} removed"), &reply, args.json);
        }
        ClusterAction::AllowVote { candidate_id } => {
            let reply = client
                .allow_vote(peers.cluster_request(pb::AllowVoteRequest { candidate_id }))
                .await
                .map_err(failed)?
                .into_inner();
            if args.json {
                println!(
                    "{}",
                    json!({ "candidate_id": candidate_id, "standing": reply.standing })
                );
            } else {
                println!(
                    "{endpoint} ({}) may now vote for node {candidate_id}",
                    reply.standing
                );
            }
        }
        ClusterAction::TransferLeader { node_id } => {
            let mut request = peers.cluster_request(pb::TransferLeaderRequest { node_id });
            request.set_timeout(Duration::from_secs(30));
            let reply = client
                .transfer_leader(request)
                .await
                .map_err(failed)?
                .into_inner();
            if args.json {
                println!("{}", json!({ "leader_id": reply.leader_id }));
            } else {
                println!("node {} leads", reply.leader_id);
            }
        }
    }
    Ok(())
}

fn members_json(members: &[pb::Member]) -> serde_json::Value {
    members
        .iter()
        .map(|m| json!({ "node_id": m.node_id, "address": m.address, "voter": m.voter }))
        .collect()
}

fn print_members(done: &str, reply: &pb::MembershipResponse, as_json: bool) {
    if as_json {
        println!("{}", json!({ "members": members_json(&reply.members) }));
    } else {
        println!("{done}; members:");
        for m in &reply.members {
            let kind = if m.voter { "voter" } else { "learner" };
            println!("  {:>3}  {kind:<7}  {}", m.node_id, m.address);
        }
    }
}

/// `cairn cluster status --json`.
pub fn status_json(s: &pb::StatusResponse) -> serde_json::Value {
    json!({
        "node_id": s.node_id,
        "role": s.role,
        "term": s.term,
        "leader_id": (s.leader_id != 0).then_some(s.leader_id),
        "leader_address": (!s.leader_address.is_empty()).then_some(&s.leader_address),
        "last_log_index": s.last_log_index,
        "committed_index": s.committed_index,
        "applied_index": s.applied_index,
        "members": members_json(&s.members),
        "followers": s.followers.iter()
            .map(|f| json!({ "node_id": f.node_id, "matched_index": f.matched_index }))
            .collect::<Vec<_>>(),
        "boundaries": s.boundaries.iter()
            .map(|b| json!({
                "name": b.name,
                "commit_position": b.commit_position,
                "prepare_position": b.prepare_position,
                "idempotent_event_ids": b.idempotent_event_ids,
            }))
            .collect::<Vec<_>>(),
        "version": s.version,
        "standing": s.standing,
        "cluster_id": (!s.cluster_id.is_empty()).then_some(&s.cluster_id),
    })
}

/// `cairn cluster status`.
pub fn status_text(s: &pb::StatusResponse) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let leader = if s.leader_id == 0 {
        "no leader known".to_string()
    } else {
        format!("leader {} at {}", s.leader_id, s.leader_address)
    };
    let _ = writeln!(
        out,
        "node {} ({}), term {}, {leader}, cairn {}",
        s.node_id, s.role, s.term, s.version
    );
    if !s.cluster_id.is_empty() {
        let _ = writeln!(out, "cluster {}", s.cluster_id);
    }
    if !s.standing.is_empty() && s.standing != "voting" {
        let why = match s.standing.as_str() {
            "undecided" => "no raft state: waiting for every initial member to answer",
            "rejoining" => "lost its raft state: rejoining, it votes once it is a voter again",
            _ => "",
        };
        let _ = writeln!(out, "does not vote ({}): {why}", s.standing);
    }
    let _ = writeln!(
        out,
        "log: last {}, committed {}, applied {}",
        s.last_log_index, s.committed_index, s.applied_index
    );
    let _ = writeln!(out, "members:");
    for m in &s.members {
        let kind = if m.voter { "voter" } else { "learner" };
        let progress = s
            .followers
            .iter()
            .find(|f| f.node_id == m.node_id)
            .map(|f| format!("  matched {}", f.matched_index))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:>3}  {kind:<7}  {}{progress}",
            m.node_id, m.address
        );
    }
    if !s.boundaries.is_empty() {
        let _ = writeln!(out, "boundaries (last position applied here):");
        for b in &s.boundaries {
            let _ = writeln!(
                out,
                "  {}  ({}, {}){}",
                b.name,
                b.commit_position,
                b.prepare_position,
                if b.idempotent_event_ids {
                    "  idempotent event ids"
                } else {
                    ""
                }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> pb::StatusResponse {
        pb::StatusResponse {
            node_id: 2,
            role: "follower".into(),
            term: 3,
            leader_id: 1,
            leader_address: "a:5006".into(),
            committed_index: 9,
            applied_index: 9,
            last_log_index: 10,
            members: vec![
                pb::Member {
                    node_id: 1,
                    address: "a:5006".into(),
                    voter: true,
                },
                pb::Member {
                    node_id: 4,
                    address: "d:5006".into(),
                    voter: false,
                },
            ],
            followers: vec![],
            boundaries: vec![
                pb::BoundaryHead {
                    name: "orders".into(),
                    commit_position: 7,
                    prepare_position: 0,
                    idempotent_event_ids: false,
                },
                pb::BoundaryHead {
                    name: "payments".into(),
                    commit_position: 3,
                    prepare_position: 2,
                    idempotent_event_ids: true,
                },
            ],
            version: "0.1.0".into(),
            standing: "rejoining".into(),
            cluster_id: "5b0c1e2d3f4a5b6c7d8e9f0a1b2c3d4e".into(),
        }
    }

    #[test]
    fn status_reads_as_text_and_json() {
        let text = status_text(&sample());
        assert!(
            text.starts_with("node 2 (follower), term 3, leader 1 at a:5006"),
            "{text}"
        );
        assert!(text.contains("    4  learner  d:5006"), "{text}");
        assert!(
            text.contains("does not vote (rejoining): lost its raft state"),
            "{text}"
        );
        assert!(text.contains("  orders  (7, 0)\n"), "{text}");
        assert!(
            text.contains("  payments  (3, 2)  idempotent event ids\n"),
            "{text}"
        );
        let value = status_json(&sample());
        assert_eq!(value["leader_id"], 1);
        assert_eq!(value["members"][1]["voter"], false);
        assert_eq!(value["boundaries"][0]["commit_position"], 7);
        assert_eq!(value["boundaries"][1]["idempotent_event_ids"], true);
        assert_eq!(value["standing"], "rejoining");
        assert_eq!(value["cluster_id"], "5b0c1e2d3f4a5b6c7d8e9f0a1b2c3d4e");
        assert!(
            text.contains("\ncluster 5b0c1e2d3f4a5b6c7d8e9f0a1b2c3d4e\n"),
            "{text}"
        );
        let mut voting = sample();
        voting.standing = "voting".into();
        assert!(!status_text(&voting).contains("does not vote"));
        let mut leaderless = sample();
        leaderless.leader_id = 0;
        leaderless.leader_address.clear();
        assert!(status_json(&leaderless)["leader_id"].is_null());
        let mut unformed = sample();
        unformed.cluster_id.clear();
        assert!(status_json(&unformed)["cluster_id"].is_null());
        assert!(!status_text(&unformed).contains("cluster "));
        assert!(status_text(&leaderless).contains("no leader known"));
    }
}
