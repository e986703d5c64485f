//! The bootstrap admin in a cluster: a clustered first start with the public default
//! password is refused, and an admin deleted through the API is not re-created by the
//! start-up writes of a later leader; a session-token key rotated through any node holds on
//! every node.

use crate::support;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use support::cluster::Cluster;
use support::with_basic;

const ROOT: (&str, &str) = ("root", "root-password");

#[test]
fn a_clustered_first_start_with_the_default_password_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .args(["--peer-listen", "127.0.0.1:0", "--node-id", "1"])
        .args(["--initial-members", "1=127.0.0.1:1"])
        .args(["--cluster-secret", support::cluster::SECRET])
        .output()
        .expect("cairn runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "it started: {log}");
    assert!(
        log.contains("clustered") && log.contains("--allow-default-password"),
        "the refusal does not say why and what to do: {log}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "a refused start wrote nothing"
    );
}

async fn usernames(cluster: &Cluster, id: u64) -> Vec<String> {
    AdminClient::new(cluster.node(id).channel().await)
        .list_users(with_basic(pb::ListUsersRequest {}, ROOT.0, ROOT.1))
        .await
        .expect("list users")
        .into_inner()
        .users
        .into_iter()
        .map(|u| u.username)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_admin_stays_deleted_through_changes_of_leader() {
    let mut cluster = Cluster::start(3, &[]).await;
    let first = cluster.leader_among(&[1, 2, 3]).await;
    let mut admin = AdminClient::new(cluster.node(first).channel().await);
    admin
        .create_user(support::admin(pb::CreateUserRequest {
            name: "Root".into(),
            username: ROOT.0.into(),
            password: ROOT.1.into(),
            roles: vec!["ADMIN".into()],
        }))
        .await
        .expect("create root");
    let admin_id = admin
        .list_users(with_basic(pb::ListUsersRequest {}, ROOT.0, ROOT.1))
        .await
        .expect("list")
        .into_inner()
        .users
        .into_iter()
        .find(|u| u.username == "admin")
        .expect("the bootstrap admin")
        .user_id;
    admin
        .delete_user(with_basic(
            pb::DeleteUserRequest { user_id: admin_id },
            ROOT.0,
            ROOT.1,
        ))
        .await
        .expect("delete admin");

    // Each new leader runs the start-up writes as soon as it leads (before this test can
    // reach it); before, they re-created the admin with the flag's password.
    let mut leader = first;
    for _ in 0..2 {
        cluster.kill(leader);
        let others: Vec<u64> = cluster
            .ids()
            .into_iter()
            .filter(|&id| id != leader)
            .collect();
        let next = cluster.leader_among(&others).await;
        let mut on_next = AdminClient::new(cluster.node(next).channel().await);
        on_next
            .create_user(with_basic(
                pb::CreateUserRequest {
                    name: format!("after {next}"),
                    username: format!("user-{next}"),
                    password: "password-of-a-user".into(),
                    roles: vec!["OPERATIONS".into()],
                },
                ROOT.0,
                ROOT.1,
            ))
            .await
            .expect("a write through the new leader");
        let names = usernames(&cluster, next).await;
        assert!(
            !names.contains(&"admin".to_string()),
            "admin came back: {names:?}"
        );
        cluster.restart(leader).await;
        leader = next;
    }
}

/// `cairn tokens <args>` against node `id`'s client port as the bootstrap admin.
fn tokens_cli(cluster: &Cluster, id: u64, args: &[&str]) -> serde_json::Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("tokens")
        .args(args)
        .arg("--endpoint")
        .arg(cluster.node(id).addr.to_string())
        .args(["--password", "changeit", "--json"])
        .output()
        .expect("cairn tokens");
    assert!(
        output.status.success(),
        "cairn tokens {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

async fn ping_with_token(cluster: &Cluster, id: u64, token: &str) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(pb::PingRequest {});
    request
        .metadata_mut()
        .insert("x-auth-token", token.parse().expect("ascii"));
    EventStoreClient::new(cluster.node(id).channel().await)
        .ping(request)
        .await
        .map(|response| {
            response
                .metadata()
                .get("x-auth-token")
                .and_then(|v| v.to_str().ok())
                .expect("a token")
                .to_string()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_key_rotated_through_a_follower_holds_on_every_node() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    let login = EventStoreClient::new(cluster.node(leader).channel().await)
        .ping(support::admin(pb::PingRequest {}))
        .await
        .expect("login");
    let old = login
        .metadata()
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .expect("a token")
        .to_string();

    let rotated = tokens_cli(&cluster, follower, &["rotate-key", "--grace-secs", "600"]);
    assert_eq!(rotated["generation"], 1, "{rotated}");
    let until = rotated["previous_accepted_until_unix_seconds"]
        .as_i64()
        .expect("until");
    let at = rotated["rotated_at_unix_seconds"].as_i64().expect("at");
    assert_eq!(until - at, 600);
    let mut fresh = None;
    for id in cluster.ids() {
        // Every node has applied the rotation once it reports it (a linearizable read).
        assert_eq!(tokens_cli(&cluster, id, &["status"]), rotated, "node {id}");
        let handed_out = ping_with_token(&cluster, id, &old)
            .await
            .unwrap_or_else(|e| panic!("node {id} refused the old token in its grace: {e:?}"));
        assert_ne!(handed_out, old, "node {id} hands out tokens of the new key");
        fresh.get_or_insert(handed_out);
    }
    let fresh = fresh.expect("a new-key token");

    tokens_cli(&cluster, leader, &["rotate-key", "--grace-secs", "0"]);
    for id in cluster.ids() {
        tokens_cli(&cluster, id, &["status"]);
        for stale in [&old, &fresh] {
            let refused = ping_with_token(&cluster, id, stale)
                .await
                .expect_err("a retired key's token");
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "node {id}");
        }
    }
}
