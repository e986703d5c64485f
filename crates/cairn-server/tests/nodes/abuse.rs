//! Hostile and buggy clients against the real `cairn` binary (docs/security.md): a flood of
//! wrong passwords, a thousand idle connections and a hundred subscribers that never read
//! must not take the node's memory or stop the clients that behave. Black box: the node
//! is a child process, its memory read from `/proc/<pid>/status`.
//!
//! They live beside the other process suites (not in the top-level `tests` crate) because
//! only this package's tests can find the `cairn` binary cargo built for them.

use std::path::Path;
use std::time::Duration;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use futures::StreamExt;
use tonic::Code;

use crate::support::{self, Node, admin, create_user, with_basic};

/// Growth of the node's resident memory a flood of wrong passwords may cause.
const FLOOD_RSS_GROWTH_LIMIT: u64 = 256 * 1024 * 1024;

/// A `/proc/<pid>/status` field in bytes (`VmRSS`, `VmHWM`: reported in kB).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn spawn(data: &Path) -> Node {
    Node::spawn(data, &["--boundaries", "default"])
}

/// Review H4: 1,000 concurrent calls with wrong passwords (each a new guess, so each asks
/// for argon2's 19 MiB) leave the node's memory within bounds, are each answered
/// UNAUTHENTICATED or RESOURCE_EXHAUSTED, and a reader's calls all complete meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_wrong_passwords_neither_takes_memory_nor_stops_readers() {
    let dir = tempfile::tempdir().expect("dir");
    let node = spawn(&dir.path().join("data"));
    let pid = node.pid().expect("pid");
    create_user(&node, "reader", "reader-password").await;
    let mut reader = EventStoreClient::new(node.channel().await);
    // The reader's first call verifies its password; later ones are answered from memory.
    reader
        .ping(with_basic(pb::PingRequest {}, "reader", "reader-password"))
        .await
        .expect("reader logs in");
    let before = proc_status_bytes(pid, "VmRSS");

    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(node.channel().await);
    }
    let flood = futures::future::join_all((0..1000).map(|i| {
        let mut client = EventStoreClient::new(channels[i % channels.len()].clone());
        async move {
            client
                .ping(with_basic(
                    pb::PingRequest {},
                    "admin",
                    &format!("guess-{i}"),
                ))
                .await
                .expect_err("wrong password")
                .code()
        }
    }));
    let reads = async {
        let mut answered = 0;
        for _ in 0..50 {
            reader
                .get_events(with_basic(
                    pb::GetEventsRequest {
                        boundary: "default".into(),
                        count: 10,
                        ..Default::default()
                    },
                    "reader",
                    "reader-password",
                ))
                .await
                .expect("the reader is served during the flood");
            answered += 1;
        }
        answered
    };
    let (codes, answered) = tokio::join!(flood, reads);
    assert_eq!(answered, 50);
    let unauthenticated = codes
        .iter()
        .filter(|c| **c == Code::Unauthenticated)
        .count();
    let exhausted = codes
        .iter()
        .filter(|c| **c == Code::ResourceExhausted)
        .count();
    assert_eq!(
        unauthenticated + exhausted,
        1000,
        "every guess refused as wrong or as too many: {codes:?}"
    );
    assert!(exhausted > 0, "a flood beyond the queue is turned away");
    let peak = proc_status_bytes(pid, "VmHWM");
    assert!(
        peak.saturating_sub(before) < FLOOD_RSS_GROWTH_LIMIT,
        "resident memory grew by {} MiB during the flood (from {} MiB)",
        peak.saturating_sub(before) / (1024 * 1024),
        before / (1024 * 1024)
    );
    // And the node still takes new logins once the flood is over.
    create_user(&node, "late", "late-password").await;
}

fn subscription(name: &str) -> pb::CatchUpSubscribeToEventStoreRequest {
    pb::CatchUpSubscribeToEventStoreRequest {
        after_position: Some(pb::Position {
            commit_position: 0,
            prepare_position: 0,
        }),
        query: None,
        subscriber_name: name.into(),
        boundary: "default".into(),
    }
}

/// A thousand connections that never send a byte and a hundred subscribers that never
/// read what they asked for hold only their own slots: a writer keeps committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_and_stalled_subscribers_do_not_stop_a_writer() {
    let dir = tempfile::tempdir().expect("dir");
    let node = spawn(&dir.path().join("data"));
    let mut writer = EventStoreClient::new(node.channel().await);
    // Enough history that every stalled subscriber has a full channel of it waiting.
    let padding = "p".repeat(4096);
    for i in 0..200 {
        writer
            .save_events_v2(admin(pb::SaveEventsV2Request {
                boundary: "default".into(),
                events: (0..10)
                    .map(|k| pb::EventToSave {
                        event_id: format!("seed-{i}-{k}"),
                        event_type: "Seed".into(),
                        data: format!(r#"{{"i":{i},"pad":"{padding}"}}"#),
                        metadata: String::new(),
                    })
                    .collect(),
                consistency: vec![],
            }))
            .await
            .expect("seed");
    }
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(
            tokio::net::TcpStream::connect(node.addr)
                .await
                .expect("idle connection"),
        );
    }
    // 100 subscribers of four users (a user may hold 64), none of which ever reads on.
    let mut stalled = Vec::new();
    for user in 0..4 {
        let name = format!("sub{user}");
        create_user(&node, &name, "sub-password").await;
        for s in 0..25 {
            // A connection each: streams on one HTTP/2 connection share its flow-control
            // window, so a client stalling some of its streams starves its own others.
            let mut client = EventStoreClient::new(node.channel().await);
            let mut stream = client
                .catch_up_subscribe_to_events(with_basic(
                    subscription(&format!("stalled-{user}-{s}")),
                    &name,
                    "sub-password",
                ))
                .await
                .expect("subscribe")
                .into_inner();
            // One event read, then never again.
            stream.next().await.expect("open").expect("first event");
            stalled.push(stream);
        }
    }
    for i in 0..100 {
        tokio::time::timeout(
            Duration::from_secs(30),
            writer.save_events_v2(admin(pb::SaveEventsV2Request {
                boundary: "default".into(),
                events: vec![pb::EventToSave {
                    event_id: format!("live-{i}"),
                    event_type: "Live".into(),
                    data: format!(r#"{{"i":{i}}}"#),
                    metadata: String::new(),
                }],
                consistency: vec![],
            })),
        )
        .await
        .unwrap_or_else(|_| panic!("write {i} committed within 30 s"))
        .expect("write commits");
    }
    // A new client still gets in and reads what was written.
    let mut fresh = EventStoreClient::new(node.channel().await);
    let last = fresh
        .get_events(admin(pb::GetEventsRequest {
            boundary: "default".into(),
            count: 1,
            direction: pb::Direction::Desc as i32,
            ..Default::default()
        }))
        .await
        .expect("read")
        .into_inner()
        .events;
    assert_eq!(last[0].event_id, "live-99");
    drop((idle, stalled));
}

/// Review M5: nothing under a fresh data directory is readable by other users: the node
/// writes password hashes and the token-signing key there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_data_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    // The snapshot threshold is low so that a snapshot (checkpoint and pack) is written too.
    let node = Node::spawn(
        &data,
        &["--boundaries", "default", "--snapshot-every-entries", "5"],
    );
    create_user(&node, "someone", "someone-password").await;
    let mut writer = EventStoreClient::new(node.channel().await);
    for i in 0..20 {
        writer
            .save_events_v2(admin(pb::SaveEventsV2Request {
                boundary: "default".into(),
                events: vec![pb::EventToSave {
                    event_id: format!("e{i}"),
                    event_type: "T".into(),
                    data: "{}".into(),
                    metadata: String::new(),
                }],
                consistency: vec![],
            }))
            .await
            .expect("write");
    }
    let snapshots = data.join("snapshots");
    support::cluster::wait_for("a snapshot on disk", || async {
        std::fs::read_dir(&snapshots)
            .ok()
            .map(|entries| entries.count() > 0)
            .filter(|any| *any)
    })
    .await;
    let node_exit = node.terminate().await;
    assert!(node_exit.success(), "{node_exit:?}");
    let mut checked = 0;
    let mut pending = vec![data.clone()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let mode = meta.permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o077,
            0,
            "{} is accessible to others: {mode:03o}",
            path.display()
        );
        checked += 1;
        if meta.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("list")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(checked > 10, "the data directory holds files: {checked}");
}
