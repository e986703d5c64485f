//! Peer mutual TLS, black-box: a cluster whose nodes hold certificates of a CA made in the
//! test, each naming the host the node advertises. The replication suite's failover and
//! partition tests pass on it; a peer without a certificate of that CA, or with one naming
//! another member, can neither vote, append nor join.

use std::net::IpAddr;

use cairn_proto::cairn_v1 as cluster_pb;
use cairn_proto::cairn_v1::raft_client::RaftClient;
use cairn_raft::TypeConfig;
use cairn_raft::codec::{decode, encode, encode_append_entries};
use openraft::Vote;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use tonic::Code;
use tonic::transport::Channel;

use crate::cluster::{
    all_events, client, event, others, partitioned_leader_stops_serving, save,
    survive_leader_kills_and_pauses,
};
use crate::support::cluster::{Cluster, advertised_host, wait_for, with_secret};
use crate::support::peer_pki::{PeerCert, PeerPki};
use crate::support::{Launching, http_get};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_keeps_every_acknowledged_write_through_leader_kills_and_pauses() {
    survive_leader_kills_and_pauses(Cluster::start_with_peer_tls(3, &[]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_carries_on_behind_a_partitioned_leader() {
    partitioned_leader_stops_serving(Cluster::start_with_peer_tls(3, &[]).await).await;
}

/// A vote request of `candidate` in `term`: granted, it would move the voter to that term
/// and cost the leader its place.
fn vote(term: u64, candidate: u64) -> Vec<u8> {
    encode(&VoteRequest::<u64>::new(Vote::new(term, candidate), None)).expect("encode a vote")
}

/// An AppendEntries of `leader` in `term`: taken, the receiver would follow that leader.
fn append(term: u64, leader: u64) -> Vec<u8> {
    encode_append_entries(&AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    })
    .expect("encode an append")
}

enum Rpc {
    Vote,
    Append,
}

/// A Raft message as a member of cluster `cluster_id` sends it.
async fn raft_call(
    cluster_id: &str,
    channel: Channel,
    rpc: Rpc,
    data: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut raft = RaftClient::new(channel);
    let mut request = with_secret(cluster_pb::RaftPayload { data });
    request
        .metadata_mut()
        .insert("x-cairn-cluster-id", cluster_id.parse().expect("ascii"));
    match rpc {
        Rpc::Vote => raft.vote(request).await,
        Rpc::Append => raft.append_entries(request).await,
    }
    .map(|r| r.into_inner().data)
}

fn denied(result: Result<Vec<u8>, tonic::Status>, says: &str) {
    let status = result.expect_err("a forged claim is refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(says), "{status:?}");
}

async fn peer_handshake_failures(cluster: &Cluster, id: u64) -> f64 {
    let metrics = http_get(cluster.node(id).http_addr, "/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("cairn_tls_handshake_failures_total{port=\"peer\"} "))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_another_ca_or_naming_another_member_can_neither_vote_nor_append() {
    let cluster = Cluster::start_with_peer_tls(3, &[]).await;
    let ids = cluster.ids();
    let leader = cluster.leader_among(&ids).await;
    let followers = others(&ids, leader);
    let (target, bystander) = (followers[0], followers[1]);
    let before = cluster.status(target).await.expect("status");
    let ahead = before.term + 100;
    let pki = cluster.peer_pki().expect("peer TLS");
    let names = |id: u64| -> Vec<IpAddr> { vec![advertised_host(id)] };
    let foreign_dir = tempfile::tempdir().expect("dir");
    let foreign = PeerPki::new(foreign_dir.path(), "foreign").issue("leader-twin", &names(leader));
    let bystanders_name = pki.issue("bystanders-name", &names(bystander));
    let no_name = pki.issue("no-name", &[]);
    let leaders_name = pki.issue("leaders-name", &names(leader));
    let via = |cert: &PeerCert| cluster.peer_channel(target, Some(cert));
    let group = std::fs::read_to_string(cluster.member(target).data_dir().join("cluster-id"))
        .expect("the cluster id")
        .trim()
        .to_string();

    // Another CA's certificate, naming the leader's host: no handshake, so no call at all.
    let failures = peer_handshake_failures(&cluster, target).await;
    for rpc in [Rpc::Vote, Rpc::Append] {
        let data = match rpc {
            Rpc::Vote => vote(ahead, leader),
            Rpc::Append => append(ahead, leader),
        };
        let refused = raft_call(&group, via(&foreign), rpc, data)
            .await
            .expect_err("foreign CA");
        assert_ne!(
            refused.code(),
            Code::PermissionDenied,
            "refused before any call: {refused:?}"
        );
    }
    assert!(peer_handshake_failures(&cluster, target).await >= failures + 2.0);

    // The cluster CA's certificates, claiming to be a member they do not name.
    let claim = format!("does not name node {leader}");
    denied(
        raft_call(
            &group,
            via(&bystanders_name),
            Rpc::Vote,
            vote(ahead, leader),
        )
        .await,
        &claim,
    );
    denied(
        raft_call(
            &group,
            via(&bystanders_name),
            Rpc::Append,
            append(ahead, leader),
        )
        .await,
        &claim,
    );
    denied(
        raft_call(&group, via(&no_name), Rpc::Append, append(ahead, leader)).await,
        &claim,
    );
    denied(
        raft_call(&group, via(&no_name), Rpc::Vote, vote(ahead, 9)).await,
        "node 9 is not a member",
    );

    // The leader's own name gets through to Raft, which answers a stale claim with a no.
    let stale = before.term.saturating_sub(1);
    let answer = raft_call(&group, via(&leaders_name), Rpc::Vote, vote(stale, leader))
        .await
        .expect("passes");
    let answer: Result<VoteResponse<u64>, openraft::error::RaftError<u64>> =
        decode(&answer).expect("a vote response");
    assert!(!answer.expect("answered").vote_granted);
    let answer = raft_call(
        &group,
        via(&leaders_name),
        Rpc::Append,
        append(stale, leader),
    )
    .await
    .expect("passes");
    let answer: Result<AppendEntriesResponse<u64>, openraft::error::RaftError<u64>> =
        decode(&answer).expect("an append response");
    assert!(!answer.expect("answered").is_success());

    // Without a client certificate, or in plaintext, the peer port takes nothing.
    let member = cluster.member(target);
    let no_cert = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(&pki.ca_file).expect("CA"),
        ))
        .domain_name(member.advertise.ip().to_string());
    let no_cert = Channel::from_shared(format!("https://{}", member.peer_addr()))
        .expect("uri")
        .tls_config(no_cert)
        .expect("TLS")
        .connect_lazy();
    raft_call(&group, no_cert, Rpc::Vote, vote(ahead, leader))
        .await
        .expect_err("no client certificate");
    let plain = Channel::from_shared(format!("http://{}", member.peer_addr()))
        .expect("uri")
        .connect_lazy();
    raft_call(&group, plain, Rpc::Vote, vote(ahead, leader))
        .await
        .expect_err("plaintext");

    // Nobody moved: same term, same leader, everywhere.
    for id in ids {
        let now = cluster.status(id).await.expect("status");
        assert_eq!(
            (now.term, now.leader_id),
            (before.term, leader),
            "node {id}"
        );
    }
}

/// A node that is never to serve, killed when the test ends however it ends.
struct Refused(Option<Launching>);

impl Refused {
    fn logged(&self, needle: &str) -> bool {
        self.0.as_ref().is_some_and(|l| l.logged(needle))
    }
}

impl Drop for Refused {
    fn drop(&mut self) {
        if let Some(launching) = self.0.take() {
            launching.kill();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_members_name_or_another_cas_certificate_cannot_join() {
    let mut cluster = Cluster::start_with_peer_tls(3, &[]).await;
    let pki_ca = cluster.peer_pki().expect("peer TLS").ca_file.clone();
    // Node 4 holds a certificate of the cluster CA naming node 2's host, not its own.
    let impostor = cluster
        .peer_pki()
        .expect("peer TLS")
        .issue("impostor", &[advertised_host(2)]);
    let impostor = Refused(Some(
        cluster.join_presenting(4, 1, &impostor, &pki_ca).await,
    ));
    // Node 5 holds a certificate naming its own host, from another CA.
    let foreign_dir = tempfile::tempdir().expect("dir");
    let foreign = PeerPki::new(foreign_dir.path(), "foreign");
    let outsider = foreign.issue("outsider", &[advertised_host(5)]);
    let outsider = Refused(Some(
        cluster
            .join_presenting(5, 1, &outsider, &foreign.ca_file)
            .await,
    ));

    wait_for("both to be turned away", || async {
        let turned_away = impostor.logged("did not answer with a certificate of the cluster CA")
            && outsider.logged("failed to be made a learner");
        turned_away.then_some(())
    })
    .await;
    let mut es = client(&cluster, 1).await;
    save(
        &mut es,
        vec![event("AfterTheAttempts", r#"{"k":"v"}"#)],
        vec![],
    )
    .await
    .expect("the cluster takes writes");
    for id in 1..=3 {
        let status = cluster.status(id).await.expect("status");
        let members: Vec<u64> = status.members.iter().map(|m| m.node_id).collect();
        assert_eq!(members, [1, 2, 3], "node {id}'s membership");
        assert_eq!(
            all_events(&mut client(&cluster, id).await)
                .await
                .expect("read")
                .len(),
            1
        );
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn peer_certificate_expiry(metrics: &str) -> Option<i64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix("cairn_tls_certificate_expiry_timestamp_seconds{certificate=\"peer\"} ")?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_peer_certificates_reach_new_connections_without_a_restart() {
    // The first certificates expire soon: once they have, a node that still presented its
    // old one (to peers it dials, or to peers dialling it) would fail every new handshake.
    let first_expiry = now() + 15;
    let mut cluster =
        Cluster::start_with_peer_tls_until(3, &["--tls-reload-secs", "1"], Some(first_expiry))
            .await;
    let ids = cluster.ids();
    let mut es = client(&cluster, 1).await;
    save(
        &mut es,
        vec![event("BeforeTheRenewal", r#"{"k":"v"}"#)],
        vec![],
    )
    .await
    .expect("a write");

    // Every node's certificate is reissued in place (same name, new key, new expiry), as
    // cert-manager or the operator would.
    let renewed_until = 2_000_000_000;
    for &id in &ids {
        cluster.peer_pki().expect("peer TLS").issue_until(
            &format!("node-{id}"),
            &[advertised_host(id)],
            Some(renewed_until),
        );
    }
    for &id in &ids {
        let http = cluster.node(id).http_addr;
        wait_for(
            &format!("node {id} to load its renewed certificate"),
            || async move {
                let metrics = http_get(http, "/metrics").await;
                (peer_certificate_expiry(&metrics) == Some(renewed_until)).then_some(())
            },
        )
        .await;
    }

    wait_for("the first certificates to expire", || async {
        (now() > first_expiry + 1).then_some(())
    })
    .await;

    // New connections carry the renewed certificates: a follower restarted dials and is
    // dialled afresh, and a leader killed leaves an election over fresh connections.
    let leader = cluster.leader_among(&ids).await;
    let follower = others(&ids, leader)[0];
    cluster.kill(follower);
    cluster.restart(follower).await;
    cluster.kill(leader);
    let survivors = others(&ids, leader);
    let new_leader = cluster.leader_among(&survivors).await;
    assert_ne!(new_leader, leader);
    let mut es = client(&cluster, survivors[0]).await;
    let written = save(
        &mut es,
        vec![event("AfterTheRenewal", r#"{"k":"v"}"#)],
        vec![],
    )
    .await
    .expect("a write after the renewal");
    cluster.restart(leader).await;
    let index = cluster
        .status(new_leader)
        .await
        .expect("status")
        .last_log_index;
    cluster.applied_everywhere(&ids, index).await;
    for &id in &ids {
        let events = all_events(&mut client(&cluster, id).await)
            .await
            .expect("read");
        assert_eq!(events.len(), 2, "node {id}");
        assert_eq!(events.last().and_then(|e| e.position), written.log_position);
    }
}
