//! Retention and the operator's building blocks (docs/backup.md, "Retention"): `cairn
//! backup verify --newest --record`, `cairn backup prune`, the `--result-file` a pod's
//! termination message carries, and `cairn serve --restore-from` on a first start.

use std::path::Path;

use cairn_server::config::StartFromBackup;
use cairn_store::backup as store_backup;
use cairn_tests::*;

use super::backup::backup_args;

/// `cairn backup create` of `server` into `to/name`, its outcome also written to `result`.
async fn backup_with_result(server: &TestServer, to: &Path, name: &str, result: &Path) {
    cairn_server::backup_cli::run(backup_args(&[
        "create",
        "--to",
        &to.display().to_string(),
        "--name",
        name,
        "--endpoint",
        &server.addr.to_string(),
        "--user",
        ADMIN.0,
        "--password",
        ADMIN.1,
        "--result-file",
        &result.display().to_string(),
    ]))
    .await
    .expect("backup");
}

async fn write_one(client: &mut Client, n: usize) {
    client
        .save(
            "orders",
            vec![event("Booked", &format!(r#"{{"n":{n}}}"#))],
            vec![],
        )
        .await
        .expect("write");
}

fn outcome(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("result file")).expect("json")
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn prune_lets_old_backups_go_only_behind_a_verified_one() {
    let server = TestServer::start().await;
    server.create_boundary("orders").await;
    let mut client = server.client();
    let backups = tempfile::tempdir().expect("dir");
    let results = tempfile::tempdir().expect("dir");
    let result = results.path().join("outcome.json");
    for (i, name) in ["b1", "b2", "b3", "b4"].iter().enumerate() {
        write_one(&mut client, i).await;
        backup_with_result(&server, backups.path(), name, &result).await;
        let got = outcome(&result);
        assert_eq!(got["name"], *name);
        assert_eq!(got["events"], i as u64 + 1, "{got}");
        assert!(got["bytes"].as_u64().unwrap_or_default() > 0, "{got}");
    }
    let root = backups.path().display().to_string();
    let prune = |keep_last: &'static str| {
        let (root, result) = (root.clone(), result.display().to_string());
        async move {
            cairn_server::backup_cli::run(backup_args(&[
                "prune",
                "--from",
                &root,
                "--keep-last",
                keep_last,
                "--result-file",
                &result,
            ]))
            .await
        }
    };

    // Nothing verified yet: nothing goes, however few backups retention keeps.
    prune("1").await.expect("prune");
    assert_eq!(names_in(backups.path()), ["b1", "b2", "b3", "b4"]);
    assert_eq!(outcome(&result)["newest_verified"], serde_json::Value::Null);

    cairn_server::backup_cli::run(backup_args(&[
        "verify",
        "--from",
        &root,
        "--newest",
        "--record",
        "--result-file",
        &result.display().to_string(),
    ]))
    .await
    .expect("verify");
    let verified = outcome(&result);
    assert_eq!(
        verified["name"], "b4",
        "the newest backup is the one verified"
    );
    assert_eq!(verified["verified"], true);
    assert!(
        backups
            .path()
            .join("b4")
            .join(store_backup::VERIFIED_FILE)
            .is_file()
    );
    // The record does not make the backup fail its own verification, nor its deletion.
    store_backup::verify(&backups.path().join("b4")).expect("a recorded backup verifies");

    prune("2").await.expect("prune");
    assert_eq!(names_in(backups.path()), ["b3", "b4"]);
    let pruned = outcome(&result);
    assert_eq!(pruned["deleted"], serde_json::json!(["b1", "b2"]));
    assert_eq!(pruned["newest_verified"], "b4");

    // keep-last 1 now lets b3 go: it is older than the verified b4.
    prune("1").await.expect("prune");
    assert_eq!(names_in(backups.path()), ["b4"]);

    // A failure reaches the result file too, as the one thing it says.
    let missing = backups.path().join("nothing-here").display().to_string();
    let failed = cairn_server::backup_cli::run(backup_args(&[
        "verify",
        "--from",
        &missing,
        "--result-file",
        &result.display().to_string(),
    ]))
    .await;
    assert!(failed.is_err());
    let error = outcome(&result)["error"]
        .as_str()
        .expect("error")
        .to_string();
    assert!(error.contains("nothing-here"), "{error}");
}

#[tokio::test]
async fn serve_restores_a_backup_on_its_first_start_only() {
    let source = TestServer::start().await;
    source.create_boundary("orders").await;
    let mut client = source.client();
    for i in 0..7 {
        write_one(&mut client, i).await;
    }
    let backups = tempfile::tempdir().expect("dir");
    let results = tempfile::tempdir().expect("dir");
    backup_with_result(
        &source,
        backups.path(),
        "nightly",
        &results.path().join("r.json"),
    )
    .await;
    client
        .save("orders", vec![event("Booked", r#"{"n":"late"}"#)], vec![])
        .await
        .expect("a write after the backup");

    let target = tempfile::tempdir().expect("dir");
    let data = target.path().join("data");
    // An empty data directory, as a fresh volume mounts, and a leftover of a start that
    // was cut off mid-restore: neither stops the restore.
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::create_dir_all(target.path().join("data.restoring/junk")).expect("mkdir");
    let mut config = cairn_server::config::ServeConfig::for_test(data.clone());
    config.restore = Some(StartFromBackup {
        // The location, not the backup: its newest complete backup is restored.
        from: backups.path().display().to_string(),
        to_position: None,
        boundary: None,
        archive_from: None,
        s3: Default::default(),
    });
    cairn_server::backup_cli::restore_on_first_start(&config)
        .await
        .expect("restore on first start");
    assert!(!target.path().join("data.restoring").exists());
    let restored = TestServer::start_in(target, |c| *c = config.clone()).await;
    let events = restored.client().read_all("orders").await;
    assert_eq!(events.len(), 7, "the backup's events, not the later one");

    // A second start keeps what the node holds (now 8 events), the restore is not redone.
    let mut writer = restored.client();
    writer
        .save("orders", vec![event("Booked", r#"{"n":"new"}"#)], vec![])
        .await
        .expect("write on the restored node");
    let dir = restored.stop().await;
    cairn_server::backup_cli::restore_on_first_start(&config)
        .await
        .expect("a later start");
    let again = TestServer::start_in(dir, |c| *c = config.clone()).await;
    assert_eq!(again.client().read_all("orders").await.len(), 8);
}
