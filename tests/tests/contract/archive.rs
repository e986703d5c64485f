//! Continuous archiving and restores to a position (docs/backup.md): a node with
//! `--archive-to` under concurrent writers, a base backup in the middle, and restores to
//! three positions after it that must hold exactly the source's prefix, event by event.

use std::path::Path;
use std::time::Duration;

use cairn_server::backup_target::Location;
use cairn_server::config::ArchiveConfig;
use cairn_tests::orisun as pb;
use cairn_tests::*;

use super::backup::{backup_args, restore_args, sample};

/// Writes `writes` writes of 1 to 4 events from four concurrent clients (so that log
/// entries fold several writes together).
async fn write_concurrently(server: &TestServer, from: usize, writes: usize) {
    let mut tasks = Vec::new();
    for w in 0..4 {
        let mut client = server
            .new_connection(Credentials::basic(ADMIN.0, ADMIN.1))
            .await;
        tasks.push(tokio::spawn(async move {
            for i in (from + w..from + writes).step_by(4) {
                let events = (0..1 + i % 4)
                    .map(|k| event("Booked", &format!(r#"{{"write":{i},"k":{k}}}"#)))
                    .collect();
                client.save("orders", events, vec![]).await.expect("write");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
}

/// Waits until the archive holds everything the node has applied.
async fn archive_caught_up(server: &TestServer) {
    for _ in 0..600 {
        let metrics = http_get(server.http_addr, "/metrics").await;
        let applied = sample(&metrics, "cairn_raft_applied_index");
        if applied > 0.0 && sample(&metrics, "cairn_archive_index") >= applied {
            assert_eq!(sample(&metrics, "cairn_archive_gaps_total"), 0.0);
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the archive did not catch up");
}

async fn restore_to(backups: &Path, archive: &Path, position: &str) -> anyhow::Result<TestServer> {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data").display().to_string();
    cairn_server::backup_cli::restore(restore_args(&[
        "--from",
        &backups.display().to_string(),
        "--data-dir",
        &data,
        "--to-position",
        position,
        "--boundary",
        "orders",
        "--archive-from",
        &archive.display().to_string(),
    ]))
    .await?;
    Ok(TestServer::start_in(dir, |_| {}).await)
}

fn summary(events: &[pb::Event]) -> Vec<(String, String, (i64, i64))> {
    events
        .iter()
        .map(|e| (e.event_id.clone(), e.data.clone(), pair(&e.position)))
        .collect()
}

#[tokio::test]
async fn restores_to_three_positions_hold_exactly_the_prefix_up_to_each() {
    let archive = tempfile::tempdir().expect("dir");
    let server = TestServer::start_with(|config| {
        config.archive = Some(ArchiveConfig {
            to: Location::Dir(archive.path().to_path_buf()),
            interval: Duration::from_millis(200),
            // Small segments: the replay crosses many of them.
            segment_bytes: 4096,
            max_held_entries: 1_000_000,
        });
        // Snapshots and purges often: entries must outlive openraft's purge until archived.
        config.snapshot_every_entries = 20;
        config.raft_log_kept = 0;
    })
    .await;
    server.create_boundary("orders").await;
    write_concurrently(&server, 0, 40).await;

    let backups = tempfile::tempdir().expect("dir");
    let addr = server.addr.to_string();
    cairn_server::backup_cli::run(backup_args(&[
        "create",
        "--to",
        &backups.path().display().to_string(),
        "--name",
        "base",
        "--endpoint",
        &addr,
        "--user",
        ADMIN.0,
        "--password",
        ADMIN.1,
    ]))
    .await
    .expect("backup");
    write_concurrently(&server, 40, 200).await;
    archive_caught_up(&server).await;
    let metrics = http_get(server.http_addr, "/metrics").await;
    assert!(
        sample(
            &metrics,
            "cairn_archive_segments_total{result=\"succeeded\"}"
        ) > 3.0
    );
    // Caught up: the lag is at most a round's (it is set at the end of each round).
    assert!(sample(&metrics, "cairn_archive_lag_seconds") < 30.0);

    let source = server.client().read_all("orders").await;
    assert!(source.len() > 300);
    // The last event of three writes after the backup: early, middle, the very last.
    let write_ends: Vec<usize> = (0..source.len())
        .filter(|&i| {
            i + 1 == source.len() || pair(&source[i + 1].position).0 != pair(&source[i].position).0
        })
        .collect();
    let n = write_ends.len();
    for at in [
        write_ends[n / 4 + 12],
        write_ends[n / 2 + 7],
        write_ends[n - 1],
    ] {
        let (commit, prepare) = pair(&source[at].position);
        let position = format!("{commit}:{prepare}");
        let restored = restore_to(backups.path(), archive.path(), &position)
            .await
            .unwrap_or_else(|e| panic!("restore to {position}: {e:#}"));
        let got = restored.client().read_all("orders").await;
        assert_eq!(
            summary(&got),
            summary(&source[..=at]),
            "restored to {position}: every event up to it, none after"
        );
        // The restored node takes writes from where the position left off.
        let mut client = restored.client();
        let next = client
            .save("orders", vec![event("After", "{}")], vec![])
            .await
            .expect("write after the restore");
        assert_eq!(pair(&next.log_position).1, prepare + 1);
    }

    // A position inside a write would split it: refused, nothing left behind.
    let inside = write_ends
        .windows(2)
        .find(|w| w[0] > source.len() / 2 && w[1] - w[0] >= 3)
        .map(|w| pair(&source[w[0] + 2].position))
        .expect("a write of three events or more");
    let e = restore_to(
        backups.path(),
        archive.path(),
        &format!("{}:{}", inside.0, inside.1),
    )
    .await
    .err()
    .expect("a split write is refused");
    assert!(format!("{e:#}").contains("inside the write"), "{e:#}");

    // Past the last archived event: the archive cannot show that nothing else was
    // committed up to there.
    let (commit, _) = pair(&source[source.len() - 1].position);
    let e = restore_to(
        backups.path(),
        archive.path(),
        &format!("{}:{}", commit + 10, commit + 9),
    )
    .await
    .err()
    .expect("a position past the archive is refused");
    assert!(format!("{e:#}").contains("not archived yet"), "{e:#}");
}
