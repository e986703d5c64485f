//! Durability of the real `cairn` binary: acknowledged writes survive SIGKILL.
//!
//! The test starts `cairn serve` as a child process, drives concurrent writers, kills the
//! process with SIGKILL while writes are in flight, restarts it on the same data directory
//! and checks that every acknowledged write is there at the position it was acknowledged
//! with, that boundaries and users survived, and that writes continue.
//!
//! The same with the power cut instead (`cairn-powercut`: the data directory on a FUSE disk
//! that, after the kill, forgets every write and directory change not synced — what a
//! power loss takes and SIGKILL, which keeps the page cache, does not).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use support::{Node, admin, with_basic};

fn spawn_node(data: &std::path::Path) -> Node {
    Node::spawn(data, &["--boundaries", "default"])
}

/// An acknowledged write: its event ids and the (commit, prepare) of its last event.
type Ack = (Vec<String>, (i64, i64));

fn save_request(writer: usize, i: usize) -> pb::SaveEventsV2Request {
    let n = 1 + (writer + i) % 3;
    pb::SaveEventsV2Request {
        boundary: "ledger".into(),
        events: (0..n)
            .map(|k| pb::EventToSave {
                event_id: format!("w{writer}-{i}-{k}"),
                event_type: "Entry".into(),
                data: format!(r#"{{"writer":{writer},"i":{i},"k":{k}}}"#),
                metadata: String::new(),
            })
            .collect(),
        consistency: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().expect("dir");
    acknowledged_writes_survive(&dir.path().join("data"), || {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root and /dev/fuse for the power-cut disk (run with the real-server suites)"]
async fn acknowledged_writes_survive_a_power_cut() {
    let dir = tempfile::tempdir().expect("dir");
    let disk = cairn_powercut::Disk::mount(dir.path()).expect("mount a power-cut disk");
    acknowledged_writes_survive(&disk.path().join("data"), || {
        let cut = disk.power_cut();
        eprintln!("power cut: {cut:?}");
    })
    .await;
}

/// Writes, kills the node mid-write, runs `crash` (nothing more, or a power cut) and checks
/// that every acknowledged write, the boundaries and the users are there after a restart.
async fn acknowledged_writes_survive(data: &std::path::Path, crash: impl FnOnce()) {
    let data = data.to_owned();
    let mut node = spawn_node(&data);
    let ch = node.channel().await;
    let mut admin_client = AdminClient::new(ch.clone());
    admin_client
        .create_boundary(admin(pb::CreateBoundaryRequest {
            name: "ledger".into(),
            ..Default::default()
        }))
        .await
        .expect("boundary");
    admin_client
        .create_user(admin(pb::CreateUserRequest {
            name: "Durable".into(),
            username: "durable".into(),
            password: "d-pass".into(),
            roles: vec!["OPERATIONS".into()],
        }))
        .await
        .expect("user");
    let boundaries_before = admin_client
        .list_boundaries(admin(pb::ListBoundariesRequest {}))
        .await
        .expect("list")
        .into_inner()
        .boundaries;

    // Concurrent writers record every acknowledgement: (event ids, last position).
    let acked: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let mut es = EventStoreClient::new(ch.clone());
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let req = save_request(w, i);
                let ids = req.events.iter().map(|e| e.event_id.clone()).collect();
                match es
                    .save_events_v2(with_basic(req, "durable", "d-pass"))
                    .await
                {
                    Ok(r) => {
                        let p = r.into_inner().log_position.expect("position");
                        acked
                            .lock()
                            .expect("lock")
                            .push((ids, (p.commit_position, p.prepare_position)));
                    }
                    Err(_) => return, // the node died mid-request: not acknowledged
                }
            }
        }));
    }
    while acked.lock().expect("lock").len() < 300 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    node.kill();
    for w in writers {
        w.await.expect("writer");
    }
    crash();
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() >= 300);

    let node = spawn_node(&data);
    let ch = node.channel().await;
    let mut es = EventStoreClient::new(ch.clone());
    let events = es
        .get_events(admin(pb::GetEventsRequest {
            boundary: "ledger".into(),
            count: 10_000,
            ..Default::default()
        }))
        .await
        .expect("read after restart")
        .into_inner()
        .events;
    // Dense positions, and every acknowledged write exactly where it was acknowledged.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.position.expect("p").prepare_position,
            i as i64,
            "positions stay dense"
        );
    }
    for (ids, (commit, last)) in &acked {
        let first = last - (ids.len() as i64 - 1);
        for (k, id) in ids.iter().enumerate() {
            let e = events
                .get((first + k as i64) as usize)
                .unwrap_or_else(|| panic!("acknowledged event {id} lost"));
            assert_eq!(&e.event_id, id);
            let p = e.position.expect("p");
            assert_eq!(
                (p.commit_position, p.prepare_position),
                (*commit, first + k as i64)
            );
        }
    }
    let mut admin_client = AdminClient::new(ch);
    let boundaries_after = admin_client
        .list_boundaries(admin(pb::ListBoundariesRequest {}))
        .await
        .expect("list")
        .into_inner()
        .boundaries;
    assert_eq!(boundaries_after, boundaries_before, "boundaries intact");
    // The user survived with its password; writes continue at the next position.
    let next = es
        .save_events_v2(with_basic(save_request(9, 0), "durable", "d-pass"))
        .await
        .expect("write after restart")
        .into_inner();
    let p = next.log_position.expect("p");
    assert_eq!(
        p.prepare_position,
        events.len() as i64,
        "a one-event write after the last"
    );
    drop(node);
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().expect("dir");
    let node = spawn_node(&dir.path().join("data"));
    let mut es = EventStoreClient::new(node.channel().await);
    es.ping(admin(pb::PingRequest {})).await.expect("ping");
    let exit = node.terminate().await;
    assert!(exit.success(), "exit status {exit:?}");
    // A clean shutdown leaves a database that reopens at once.
    let node = spawn_node(&dir.path().join("data"));
    let mut es = EventStoreClient::new(node.channel().await);
    es.ping(admin(pb::PingRequest {}))
        .await
        .expect("ping after restart");
}
