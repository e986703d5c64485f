//! Backups of a cluster under load, with real processes: `cairn backup create` against a
//! follower while 8 writers commit and the leader is killed, `cairn restore`, and the
//! restored directory served as a new cluster that the old members cannot reach.

use crate::cluster::{all_events, client, event, others, save};
use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use cairn_proto::cairn_v1 as cluster_pb;
use cairn_proto::cairn_v1::raft_client::RaftClient;
use support::Node;
use support::cluster::{Cluster, SECRET, wait_for};
use tonic::Code;

const WRITERS: usize = 8;

fn cairn(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("cairn")
}

fn json_of(output: &std::process::Output, what: &str) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

fn cluster_id(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("cluster-id"))
        .expect("a cluster id")
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_backed_up_under_load_while_the_leader_dies_restores_exactly_its_prefix() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let follower = others(&cluster.ids(), leader)[0];
    let ids = cluster.ids();
    let group = cluster_id(cluster.member(leader).data_dir());
    for id in &ids {
        assert_eq!(
            cluster_id(cluster.member(*id).data_dir()),
            group,
            "every member took the id of the group it formed"
        );
        let status = cluster.status(*id).await.expect("status");
        assert_eq!(status.cluster_id, group, "cluster status names it");
    }

    // 8 writers, each through a node of its own, retrying what fails (a dying leader).
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut es = client(&cluster, ids[w % ids.len()]).await;
        let (stop, acked) = (stop.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let events = (0..3)
                    .map(|i| event("Wrote", &format!(r#"{{"writer":{w},"n":{n},"i":{i}}}"#)))
                    .collect();
                if save(&mut es, events, vec![]).await.is_ok() {
                    acked.fetch_add(3, Ordering::AcqRel);
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                n += 1;
            }
        }));
    }
    wait_for("the writers to commit 600 events", || {
        let acked = acked.clone();
        async move { (acked.load(Ordering::Acquire) >= 600).then_some(()) }
    })
    .await;

    let backups = tempfile::tempdir().expect("dir");
    let endpoint = cluster.node(follower).addr.to_string();
    let to = backups.path().display().to_string();
    let run = tokio::task::spawn_blocking(move || {
        cairn(&[
            "backup",
            "create",
            "--to",
            &to,
            "--name",
            "under-load",
            "--endpoint",
            &endpoint,
            "--password",
            "changeit",
            "--json",
        ])
    });
    cluster.kill(leader);
    let taken = json_of(&run.await.expect("task"), "cairn backup create");
    let survivors = others(&ids, leader);
    cluster.leader_among(&survivors).await;
    let after_backup = acked.load(Ordering::Acquire);
    wait_for("the writers to go on through the new leader", || {
        let acked = acked.clone();
        async move { (acked.load(Ordering::Acquire) >= after_backup + 300).then_some(()) }
    })
    .await;
    stop.store(true, Ordering::Release);
    for writer in writers {
        writer.await.expect("writer");
    }
    let history = all_events(&mut client(&cluster, survivors[0]).await)
        .await
        .expect("the source's history");

    let dir = backups.path().join("under-load");
    let verified = json_of(
        &cairn(&[
            "backup",
            "verify",
            "--from",
            &dir.display().to_string(),
            "--json",
        ]),
        "cairn backup verify",
    );
    assert_eq!(verified["events"], taken["events"]);
    assert_eq!(taken["cluster_id"], serde_json::json!(group));
    assert_eq!(taken["node_id"], follower);
    let held = taken["events"].as_u64().expect("events") as usize;
    assert!(
        held > 0 && held < history.len(),
        "held {held} of {}",
        history.len()
    );

    let restored_root = tempfile::tempdir().expect("dir");
    let data = restored_root.path().join("data");
    let restored = json_of(
        &cairn(&[
            "restore",
            "--from",
            &dir.display().to_string(),
            "--data-dir",
            &data.display().to_string(),
            "--json",
        ]),
        "cairn restore",
    );
    let new_id = restored["new_cluster_id"].as_str().expect("id").to_string();
    assert_ne!(new_id, group, "a restore is a new cluster");
    assert_eq!(cluster_id(&data), new_id);

    // A restored directory forms a group of its own, never one with other members.
    let mut refused = Node::launch(
        &data,
        &[
            "--node-id",
            "1",
            "--initial-members",
            "1=127.0.0.1:1,2=127.0.0.1:2",
            "--peer-listen",
            "127.0.0.1:0",
            "--cluster-secret",
            SECRET,
            "--allow-default-password",
        ],
        None,
    );
    let status = refused.exited(Duration::from_secs(30)).await;
    assert!(status.is_some_and(|s| !s.success()), "it must not start");
    assert!(refused.logged("holds a restored backup"));

    // Served as a one-member group with a peer port: exactly the backup's prefix.
    let (leader_port, joiner_port) = (free_port(), free_port());
    let leader_peer = format!("127.0.0.1:{leader_port}");
    let launching = Node::launch(
        &data,
        &[
            "--node-id",
            "1",
            "--peer-listen",
            &leader_peer,
            "--initial-members",
            &format!("1={leader_peer}"),
            "--cluster-secret",
            SECRET,
            "--allow-default-password",
        ],
        None,
    );
    let node = launching.serving_async().await;
    assert!(node.logged("serving a restored backup as a new cluster"));
    let events = all_events(
        &mut cairn_proto::orisun::event_store_client::EventStoreClient::new(node.channel().await),
    )
    .await
    .expect("restored events");
    assert_eq!(events.len(), held);
    for (got, want) in events.iter().zip(&history) {
        assert_eq!(
            (&got.event_id, &got.data, got.position),
            (&want.event_id, &want.data, want.position),
            "the restore is the source's history, event for event"
        );
    }
    // The old group's messages are refused: with its id, or with none.
    let peer_addr = node
        .log_field("cairn is serving", "peer_addr")
        .expect("the restored node's peer address");
    let mut raft = RaftClient::new(
        tonic::transport::Channel::from_shared(format!("http://{peer_addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect"),
    );
    let append = openraft::raft::AppendEntriesRequest::<cairn_raft::TypeConfig> {
        vote: openraft::Vote::new_committed(1_000, 2),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let data = cairn_raft::codec::encode_append_entries(&append).expect("encode");
    for id in [Some(group.as_str()), None] {
        let mut request = tonic::Request::new(cluster_pb::RaftPayload { data: data.clone() });
        request.metadata_mut().insert(
            cairn_proto::CLUSTER_SECRET_HEADER,
            SECRET.parse().expect("ascii"),
        );
        if let Some(id) = id {
            request
                .metadata_mut()
                .insert("x-cairn-cluster-id", id.parse().expect("ascii"));
        }
        let refused = raft
            .append_entries(request)
            .await
            .expect_err("the old group's append");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains(&new_id), "{}", refused.message());
    }
    // Nor writes or reads forwarded by the old group: a follower of it that still takes
    // this address for its leader's would otherwise land its clients' writes here.
    let mut cluster_api = cluster_pb::cluster_client::ClusterClient::new(
        tonic::transport::Channel::from_shared(format!("http://{peer_addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect"),
    );
    fn from_old_group<T>(message: T, group: &str) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(
            cairn_proto::CLUSTER_SECRET_HEADER,
            SECRET.parse().expect("ascii"),
        );
        request
            .metadata_mut()
            .insert("x-cairn-cluster-id", group.parse().expect("ascii"));
        request
    }
    let forwarded = cluster_api
        .forward(from_old_group(
            cluster_pb::ForwardRequest { command: vec![] },
            &group,
        ))
        .await
        .expect_err("a write forwarded by the old group");
    assert_eq!(forwarded.code(), Code::PermissionDenied, "{forwarded:?}");
    let streamed = cluster_api
        .forward_stream(from_old_group(
            tokio_stream::iter(Vec::<cluster_pb::ForwardStreamRequest>::new()),
            &group,
        ))
        .await
        .expect_err("a forwarding stream from the old group");
    assert_eq!(streamed.code(), Code::PermissionDenied, "{streamed:?}");
    let read = cluster_api
        .read_index(from_old_group(cluster_pb::ReadIndexRequest {}, &group))
        .await
        .expect_err("a read index for the old group");
    assert_eq!(read.code(), Code::PermissionDenied, "{read:?}");

    // It still leads its own group: the refused appends changed nothing.
    let mut es =
        cairn_proto::orisun::event_store_client::EventStoreClient::new(node.channel().await);
    save(&mut es, vec![event("After", "{}")], vec![])
        .await
        .expect("the restored node takes writes");

    // A member that joins copies the restored state (by snapshot: the new log alone holds
    // none of it) and takes the new cluster's id.
    let joiner_dir = tempfile::tempdir().expect("dir");
    let joiner_peer = format!("127.0.0.1:{joiner_port}");
    let joiner = Node::launch(
        joiner_dir.path(),
        &[
            "--node-id",
            "2",
            "--peer-listen",
            &joiner_peer,
            "--advertise-addr",
            &joiner_peer,
            "--join",
            &leader_peer,
            "--cluster-secret",
            SECRET,
            "--allow-default-password",
        ],
        None,
    )
    .serving_async()
    .await;
    let copied = all_events(
        &mut cairn_proto::orisun::event_store_client::EventStoreClient::new(joiner.channel().await),
    )
    .await
    .expect("the joiner's events");
    assert_eq!(
        copied.len(),
        held + 1,
        "the joiner holds the restored events and the new one"
    );
    assert_eq!(
        copied.iter().map(|e| &e.event_id).collect::<Vec<_>>()[..held],
        history.iter().map(|e| &e.event_id).collect::<Vec<_>>()[..held]
    );
    assert_eq!(cluster_id(joiner_dir.path()), new_id);
}

/// A port free on 127.0.0.1 now (for an address a node must know before it binds it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
