//! A full disk (review M6), on a small tmpfs: with the free-space floor, writes are refused
//! RESOURCE_EXHAUSTED before RocksDB meets ENOSPC and resume when space is freed; without
//! it, the storage error stops Raft, the probes say so and the process exits non-zero, and
//! after a restart with room every acknowledged write is there.
//!
//! Mounting a tmpfs needs root: the tests are ignored otherwise (`.ci/run` runs them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use cairn_server::ServeConfig;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Node, admin};

/// A tmpfs mounted on a temporary directory; unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mb: u64) -> Tmpfs {
        let dir = tempfile::tempdir().expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m,mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs (needs root)");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A file of `mb` MiB that takes that much room until removed.
    fn ballast(&self, mb: usize) -> PathBuf {
        let path = self.path().join("ballast");
        std::fs::write(&path, vec![0xa5u8; mb * 1024 * 1024]).expect("ballast");
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// 16 KiB of hex digits LZ4 cannot shrink, so the disk fills in a few thousand writes.
fn incompressible_pad(seed: usize) -> String {
    let mut state = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..16 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from_digit((state % 16) as u32, 16).expect("hex digit")
        })
        .collect()
}

fn big_event(writer: &str, i: usize) -> pb::SaveEventsV2Request {
    pb::SaveEventsV2Request {
        boundary: "default".into(),
        events: vec![pb::EventToSave {
            event_id: format!("{writer}-{i}"),
            event_type: "Filler".into(),
            data: format!(r#"{{"i":{i},"pad":"{}"}}"#, incompressible_pad(i)),
            metadata: String::new(),
        }],
        consistency: vec![],
    }
}

/// Writes until a write fails; returns the acknowledged event ids and the failure.
async fn write_until_refused(channel: Channel, writer: &str) -> (Vec<String>, tonic::Status) {
    let mut client = EventStoreClient::new(channel);
    let mut acked = Vec::new();
    for i in 0..100_000 {
        match client.save_events_v2(admin(big_event(writer, i))).await {
            Ok(_) => acked.push(format!("{writer}-{i}")),
            Err(status) => return (acked, status),
        }
    }
    panic!("the disk never filled");
}

async fn stored_ids(channel: Channel) -> Vec<String> {
    let mut client = EventStoreClient::new(channel);
    let mut ids = Vec::new();
    let mut from = None;
    loop {
        let page = client
            .get_events(admin(pb::GetEventsRequest {
                boundary: "default".into(),
                count: 1000,
                from_position: from,
                ..Default::default()
            }))
            .await
            .expect("read")
            .into_inner()
            .events;
        let Some(last) = page.last() else { break };
        let at = last.position.expect("position");
        from = Some(pb::Position {
            commit_position: at.commit_position,
            prepare_position: at.prepare_position + 1,
        });
        ids.extend(page.into_iter().map(|e| e.event_id));
    }
    ids
}

fn assert_all_there(acked: &[String], stored: &[String]) {
    let stored: std::collections::HashSet<&String> = stored.iter().collect();
    let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
}

fn small_store(config: &mut ServeConfig) {
    // Small memtables flush often, so the disk fills with SSTs as well as the WAL.
    config.memtable_bytes = 1024 * 1024;
    config.block_cache_bytes = 4 * 1024 * 1024;
}

async fn channel_to(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a tmpfs; run by .ci/run with --ignored"]
async fn below_the_free_space_floor_writes_are_refused_and_none_is_lost() {
    let disk = Tmpfs::mount(96);
    let ballast = disk.ballast(16);
    let data = disk.path().join("data");
    let mut config = ServeConfig::for_test(data.clone());
    small_store(&mut config);
    config.min_free_disk_bytes = 24 * 1024 * 1024;
    let server = cairn_server::start(config.clone()).await.expect("start");
    let channel = channel_to(server.grpc_addr).await;
    let (acked, refused) = write_until_refused(channel.clone(), "a").await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--min-free-disk-mb"),
        "{}",
        refused.message()
    );
    assert!(
        acked.len() > 100,
        "the disk filled only after many writes: {} ({refused:?})",
        acked.len()
    );
    assert!(
        server.node().raft.fatal().is_none(),
        "Raft never met ENOSPC"
    );
    // Reads go on below the floor, and so do subscriptions: their leases are not data.
    assert_all_there(&acked, &stored_ids(channel.clone()).await);
    let mut subscriber = EventStoreClient::new(channel.clone())
        .catch_up_subscribe_to_events(admin(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: Some(pb::Position {
                commit_position: 0,
                prepare_position: 0,
            }),
            query: None,
            subscriber_name: "below-the-floor".into(),
            boundary: "default".into(),
        }))
        .await
        .expect("subscribe below the floor")
        .into_inner();
    let first = subscriber
        .message()
        .await
        .expect("a subscription below the floor reads")
        .expect("an event");
    assert_eq!(first.event_id, acked[0]);
    drop(subscriber);
    // Space freed: writes resume.
    std::fs::remove_file(ballast).expect("free space");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = EventStoreClient::new(channel.clone());
    client
        .save_events_v2(admin(big_event("b", 0)))
        .await
        .expect("writes resume once space is freed");
    server.shutdown().await.expect("clean shutdown");
    let restarted = cairn_server::start(config).await.expect("restart");
    let stored = stored_ids(channel_to(restarted.grpc_addr).await).await;
    assert_all_there(&acked, &stored);
    assert!(stored.contains(&"b-0".to_string()));
    restarted.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a tmpfs; run by .ci/run with --ignored"]
async fn without_a_floor_a_full_disk_stops_raft_the_probes_fail_and_nothing_is_lost() {
    // The ballast is a third of the disk: once it is gone, replaying the log, flushing and
    // compacting have room.
    let disk = Tmpfs::mount(48);
    let ballast = disk.ballast(16);
    let data = disk.path().join("data");
    let mut config = ServeConfig::for_test(data.clone());
    small_store(&mut config);
    config.min_free_disk_bytes = 0;
    config.shutdown_grace = Duration::from_secs(2);
    let server = cairn_server::start(config.clone()).await.expect("start");
    let channel = channel_to(server.grpc_addr).await;
    let (acked, failed) = write_until_refused(channel.clone(), "a").await;
    assert!(
        matches!(failed.code(), Code::Unavailable | Code::Internal),
        "a storage error, not a client error: {failed:?}"
    );
    let why = tokio::time::timeout(Duration::from_secs(30), server.fatal())
        .await
        .expect("Raft stops on the storage error");
    assert!(!why.is_empty());
    for probe in ["/healthz", "/readyz"] {
        let reply = http_get(server.http_addr, probe).await;
        assert!(
            reply.starts_with("HTTP/1.1 503"),
            "{probe} reports the stopped node: {reply}"
        );
        assert!(reply.contains("raft stopped"), "{reply}");
    }
    // The process would exit here; a restart with room replays the log.
    let _ = server.shutdown().await;
    std::fs::remove_file(ballast).expect("free space");
    let restarted = cairn_server::start(config)
        .await
        .expect("restart after freeing space");
    let stored = stored_ids(channel_to(restarted.grpc_addr).await).await;
    assert_all_there(&acked, &stored);
    restarted.shutdown().await.expect("clean shutdown");
}

/// The binary's side of it: a node whose Raft stopped exits non-zero (so that Kubernetes or
/// systemd restarts it) instead of answering probes as a zombie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a tmpfs; run by .ci/run with --ignored"]
async fn the_process_exits_non_zero_when_raft_stops_on_a_full_disk() {
    let disk = Tmpfs::mount(48);
    let _ballast = disk.ballast(8);
    let data = disk.path().join("data");
    let mut node = Node::spawn(
        &data,
        &[
            "--boundaries",
            "default",
            "--min-free-disk-mb",
            "0",
            "--memtable-mb",
            "1",
            "--block-cache-mb",
            "4",
            "--shutdown-grace-secs",
            "2",
        ],
    );
    let (acked, _) = write_until_refused(node.channel().await, "a").await;
    assert!(!acked.is_empty());
    let status = node
        .exited(Duration::from_secs(60))
        .await
        .expect("the node exits on its own");
    assert!(!status.success(), "exit status is non-zero: {status:?}");
}

/// `GET path` over HTTP/1.1: the whole response.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}
