//! Online backup and restore (docs/backup.md): `cairn backup create` against a node under
//! writes, `cairn backup verify`, `cairn restore`, and a node served from the restored
//! directory as a new cluster.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cairn_server::backup_cli::{BackupArgs, RestoreArgs};
use cairn_server::cli::{Cli, Command};
use cairn_store::backup::{self as store_backup, Manifest};
use cairn_tests::orisun as pb;
use cairn_tests::*;
use clap::Parser;
use tonic::Code;

pub(super) fn backup_args(args: &[&str]) -> BackupArgs {
    let argv = ["cairn", "backup"].iter().chain(args);
    match Cli::try_parse_from(argv).expect("valid flags").command {
        Command::Backup(args) => args,
        other => panic!("not backup: {other:?}"),
    }
}

pub(super) fn restore_args(args: &[&str]) -> RestoreArgs {
    let argv = ["cairn", "restore"].iter().chain(args);
    match Cli::try_parse_from(argv).expect("valid flags").command {
        Command::Restore(args) => args,
        other => panic!("not restore: {other:?}"),
    }
}

/// Runs `cairn backup create` against `server` as `user`, into `to/name`.
async fn backup(
    server: &TestServer,
    user: (&str, &str),
    to: &Path,
    name: &str,
) -> anyhow::Result<()> {
    let addr = server.addr.to_string();
    let to = to.display().to_string();
    cairn_server::backup_cli::run(backup_args(&[
        "create",
        "--to",
        &to,
        "--name",
        name,
        "--endpoint",
        &addr,
        "--user",
        user.0,
        "--password",
        user.1,
    ]))
    .await
}

fn key_event(i: usize) -> pb::EventToSave {
    event("Booked", &format!(r#"{{"n":{i},"slot":"s{}"}}"#, i % 7))
}

#[tokio::test]
async fn a_backup_taken_under_writes_restores_exactly_the_events_up_to_its_manifest() {
    let server = TestServer::start().await;
    server.create_boundary("orders").await;
    server
        .create_user("clerk", "clerk-password", &["OPERATIONS"])
        .await;

    // A writer committing 5-event writes until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        let mut client = server
            .new_connection(Credentials::basic(ADMIN.0, ADMIN.1))
            .await;
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Acquire) {
                let events = (n..n + 5).map(key_event).collect();
                client.save("orders", events, vec![]).await.expect("write");
                n += 5;
                written.store(n, Ordering::Release);
            }
            n
        })
    };
    while written.load(Ordering::Acquire) < 200 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    let backups = tempfile::tempdir().expect("dir");
    let acked_before = written.load(Ordering::Acquire);
    backup(&server, ADMIN, backups.path(), "first")
        .await
        .expect("backup");
    let acked_after = written.load(Ordering::Acquire);
    // Go on writing for a while after the backup: none of it may appear in the restore.
    while written.load(Ordering::Acquire) < acked_after + 100 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Release);
    let total = writer.await.expect("writer");
    server
        .create_user("late", "late-password", &["OPERATIONS"])
        .await;

    let dir = backups.path().join("first");
    assert!(
        dir.join(store_backup::MANIFEST_FILE).is_file(),
        "the manifest is written"
    );
    let staging = server
        .dir
        .path()
        .join("data")
        .join(cairn_server::backup::BACKUP_STAGING_DIR);
    assert!(
        store_backup::is_empty_dir(&staging).expect("list"),
        "the node removed its checkpoint after streaming it"
    );
    let manifest: Manifest = store_backup::verify(&dir).expect("the backup verifies");
    let orders = manifest
        .boundaries
        .iter()
        .find(|b| b.name == "orders")
        .expect("orders in the manifest");
    let held = orders.events as usize;
    assert!(
        held >= acked_before && held <= acked_after && held.is_multiple_of(5),
        "the backup holds {held} events: at least the {acked_before} acknowledged before it began, \
         at most the {acked_after} acknowledged when it ended, whole writes only"
    );
    assert_eq!(
        (orders.last_commit, orders.last_prepare),
        (held as i64, held as i64 - 1)
    );
    assert!(total >= held + 100);
    assert!(manifest.applied.index > 0);
    let cli_verify = cairn_server::backup_cli::run(backup_args(&[
        "verify",
        "--from",
        &dir.display().to_string(),
    ]))
    .await;
    assert!(cli_verify.is_ok(), "{cli_verify:?}");

    let source_events = server.client().read_all("orders").await;
    assert_eq!(source_events.len(), total);

    let restored_dir = tempfile::tempdir().expect("dir");
    let data = restored_dir.path().join("data");
    let (from, to) = (dir.display().to_string(), data.display().to_string());
    cairn_server::backup_cli::restore(restore_args(&["--from", &from, "--data-dir", &to]))
        .await
        .expect("restore");

    let restored = TestServer::start_in(restored_dir, |_| {}).await;
    let mut client = restored.client();
    let events = client.read_all("orders").await;
    assert_eq!(events.len(), held, "the restore holds the backup's events");
    for (got, want) in events.iter().zip(&source_events) {
        assert_eq!(
            (
                &got.event_id,
                &got.event_type,
                &got.data,
                pair(&got.position)
            ),
            (
                &want.event_id,
                &want.event_type,
                &want.data,
                pair(&want.position)
            ),
            "restored events are the source's, position for position"
        );
    }

    // Users as of the backup: the clerk logs in, the user created afterwards does not exist.
    let mut clerk = restored.client_with(Credentials::basic("clerk", "clerk-password"));
    clerk.read_all("orders").await;
    let late = restored
        .client_with(Credentials::basic("late", "late-password"))
        .read("orders", None, None, 1, pb::Direction::Asc)
        .await
        .expect_err("late was created after the backup");
    assert_eq!(late.code(), Code::Unauthenticated);

    // A new cluster that goes on from the restored positions, under the same CCC rules.
    let context = query(vec![criterion(&[("slot", "s1")])]);
    let latest = client
        .latest("orders", context.criteria.clone())
        .await
        .expect("latest");
    let seen = latest.context_position.expect("position");
    let stale = observe(
        context.clone(),
        pos(seen.commit_position - 1, seen.prepare_position - 1),
    );
    let refused = client
        .save("orders", vec![key_event(1)], vec![stale])
        .await
        .expect_err("a stale observation is refused on the restored node");
    assert_eq!(refused.code(), Code::AlreadyExists);
    let fresh = observe(context, seen);
    let result = client
        .save("orders", vec![key_event(1)], vec![fresh])
        .await
        .expect("write on the restored node");
    assert_eq!(
        pair(&result.log_position),
        (held as i64 + 1, held as i64),
        "the first write after the restore follows its last event"
    );
}

#[tokio::test]
async fn a_backup_needs_the_admin_role_and_a_restore_an_empty_directory() {
    let server = TestServer::start().await;
    server
        .create_user("clerk", "clerk-password", &["OPERATIONS"])
        .await;
    let backups = tempfile::tempdir().expect("dir");
    let refused = backup(&server, ("clerk", "clerk-password"), backups.path(), "b")
        .await
        .expect_err("OPERATIONS may not take backups");
    assert!(
        format!("{refused:#}").contains("PermissionDenied"),
        "{refused:#}"
    );
    assert!(
        !backups
            .path()
            .join("b")
            .join(store_backup::MANIFEST_FILE)
            .exists(),
        "a refused backup is never complete"
    );

    backup(&server, ADMIN, backups.path(), "ok")
        .await
        .expect("backup");
    let taken_again = backup(&server, ADMIN, backups.path(), "ok")
        .await
        .expect_err("a name is used once");
    assert!(
        format!("{taken_again:#}").contains("exists already"),
        "{taken_again:#}"
    );

    let used = tempfile::tempdir().expect("dir");
    std::fs::write(used.path().join("something"), b"x").expect("write");
    let from = backups.path().join("ok").display().to_string();
    let to = used.path().display().to_string();
    let e = cairn_server::backup_cli::restore(restore_args(&["--from", &from, "--data-dir", &to]))
        .await
        .expect_err("not empty");
    assert!(format!("{e:#}").contains("is not empty"), "{e:#}");
    assert_eq!(
        std::fs::read_dir(used.path()).expect("list").count(),
        1,
        "a refused restore writes nothing"
    );

    // A damaged backup is refused before anything is written.
    let sst = std::fs::read_dir(backups.path().join("ok/db"))
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "sst"))
        .expect("an sst");
    let mut bytes = std::fs::read(&sst).expect("read");
    bytes[0] ^= 0xff;
    std::fs::write(&sst, bytes).expect("write");
    let empty = tempfile::tempdir().expect("dir");
    let to = empty.path().join("data").display().to_string();
    let e = cairn_server::backup_cli::restore(restore_args(&["--from", &from, "--data-dir", &to]))
        .await
        .expect_err("checksum mismatch");
    assert!(format!("{e:#}").contains("checksum mismatch"), "{e:#}");
    assert!(
        !empty.path().join("data").exists(),
        "a refused restore creates nothing"
    );
}

/// The value of a sample in a Prometheus text exposition (0 when absent).
pub(super) fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_whole_backup_shows_in_the_metrics_and_its_time_survives_a_restart() {
    let server = TestServer::start().await;
    let before = http_get(server.http_addr, "/metrics").await;
    assert_eq!(
        sample(&before, "cairn_backup_last_success_timestamp_seconds"),
        0.0,
        "never backed up"
    );
    server
        .create_user("clerk", "clerk-password", &["OPERATIONS"])
        .await;
    let backups = tempfile::tempdir().expect("dir");
    backup(
        &server,
        ("clerk", "clerk-password"),
        backups.path(),
        "refused",
    )
    .await
    .expect_err("OPERATIONS may not take backups");
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as f64;
    backup(&server, ADMIN, backups.path(), "b")
        .await
        .expect("backup");
    let manifest = store_backup::read_manifest(&backups.path().join("b")).expect("manifest");

    // The node counts the backup once its stream ends, a moment after the client has it.
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = http_get(server.http_addr, "/metrics").await;
        if sample(&metrics, r#"cairn_backups_total{result="succeeded"}"#) > 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(
        sample(&metrics, r#"cairn_backups_total{result="succeeded"}"#),
        1.0
    );
    assert_eq!(
        sample(&metrics, r#"cairn_backups_total{result="failed"}"#),
        0.0
    );
    let last = sample(&metrics, "cairn_backup_last_success_timestamp_seconds");
    assert!(
        last >= started.floor() && last <= started + 60.0,
        "{last} vs {started}"
    );
    assert_eq!(
        sample(&metrics, "cairn_backup_bytes"),
        manifest.total_bytes() as f64
    );
    assert!(sample(&metrics, "cairn_backup_duration_seconds") > 0.0);

    let restarted = TestServer::start_in(server.stop().await, |_| {}).await;
    let after = http_get(restarted.http_addr, "/metrics").await;
    assert_eq!(
        sample(&after, "cairn_backup_last_success_timestamp_seconds"),
        last,
        "a restart keeps the time of the last backup"
    );
    assert_eq!(
        sample(&after, "cairn_backup_bytes"),
        manifest.total_bytes() as f64
    );
}
