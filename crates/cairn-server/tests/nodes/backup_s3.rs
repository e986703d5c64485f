//! Backups in an S3 bucket, against a real S3 API (moto's server) and the real `cairn`
//! binary: create (a file larger than an upload part goes up in parts), list with an
//! incomplete backup beside, verify, a damaged object refused, restore served as a new
//! cluster event for event, and delete, which refuses what is not one backup.

use std::process::Output;

use cairn_proto::orisun::event_store_client::EventStoreClient;

use crate::cluster::{all_events, event, save};
use crate::support::Node;
use crate::support::s3::S3Server;

const BUCKET: &str = "cairn-backups";
const ROOT: &str = "s3://cairn-backups/team/orders";

/// `cairn ARGS --s3-endpoint … --s3-part-mib 5` with credentials in the environment, as a
/// user's shell would have them.
fn cairn(s3: &S3Server, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .args(["--s3-endpoint", &s3.endpoint, "--s3-part-mib", "5"])
        .env("AWS_ACCESS_KEY_ID", "cairn-test")
        .env("AWS_SECRET_ACCESS_KEY", "cairn-test-secret")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .expect("cairn")
}

fn json_of(output: &Output, what: &str) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

fn refused(output: &Output, what: &str) -> String {
    assert!(!output.status.success(), "{what} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Text that LZ4 cannot shrink much, so the store's table files are as large as the data.
fn noise(len: usize, mut seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ALPHABET[(seed % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

fn backup(s3: &S3Server, node: &Node, name: &str) -> Output {
    cairn(
        s3,
        &[
            "backup",
            "create",
            "--to",
            ROOT,
            "--name",
            name,
            "--endpoint",
            &node.addr.to_string(),
            "--password",
            "changeit",
            "--json",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (pip install 'moto[server]', or CAIRN_MOTO_SERVER); run by .ci/run with --ignored"]
async fn a_backup_in_a_bucket_lists_verifies_restores_and_deletes() {
    let s3 = S3Server::start();
    s3.create_bucket(BUCKET);
    let source = tempfile::tempdir().expect("dir");
    let node = Node::spawn(source.path(), &[]);
    let mut es = EventStoreClient::new(node.channel().await);
    // 12 MiB that does not compress: the checkpoint's table file is larger than a part.
    for w in 0..12u64 {
        let events = (0..10u64)
            .map(|i| {
                let data = format!(
                    r#"{{"w":{w},"i":{i},"noise":"{}"}}"#,
                    noise(100 * 1024, w * 10 + i + 1)
                );
                event("Big", &data)
            })
            .collect();
        save(&mut es, events, vec![]).await.expect("write");
    }
    let history = all_events(&mut es).await.expect("events");
    assert_eq!(history.len(), 120);

    let missing_bucket = cairn(
        &s3,
        &[
            "backup",
            "create",
            "--to",
            "s3://no-such-bucket/x",
            "--endpoint",
            &node.addr.to_string(),
            "--password",
            "changeit",
        ],
    );
    let e = refused(&missing_bucket, "a backup into a missing bucket");
    assert!(e.contains("s3://no-such-bucket/x"), "{e}");

    let taken = json_of(&backup(&s3, &node, "first"), "cairn backup create");
    assert_eq!(taken["events"], 120);
    assert_eq!(taken["path"], format!("{ROOT}/first"));
    let objects = s3.objects(BUCKET, "team/orders/first/");
    assert!(
        objects
            .iter()
            .any(|o| o.key == "team/orders/first/manifest.json"),
        "{objects:?}"
    );
    assert_eq!(
        objects.len() as u64,
        taken["files"].as_u64().expect("files") + 1,
        "every file of the manifest, and the manifest"
    );
    let largest = objects.iter().map(|o| o.size).max().unwrap_or_default();
    assert!(
        largest > 5 * 1024 * 1024,
        "a file larger than a part ({largest} bytes) went up in parts"
    );
    let again = refused(&backup(&s3, &node, "first"), "a second backup named first");
    assert!(again.contains("holds objects already"), "{again}");

    // What a backup cut off before its manifest leaves behind.
    s3.put(BUCKET, "team/orders/partial/db/000009.sst", b"cut off");
    let listed = json_of(
        &cairn(&s3, &["backup", "list", "--from", ROOT, "--json"]),
        "cairn backup list",
    );
    let backups = listed["backups"].as_array().expect("backups");
    assert_eq!(backups.len(), 2, "{listed}");
    assert_eq!(
        (&backups[0]["name"], &backups[0]["complete"]),
        (&"first".into(), &true.into())
    );
    assert_eq!(backups[0]["events"], 120);
    assert_eq!(
        (&backups[1]["name"], &backups[1]["complete"]),
        (&"partial".into(), &false.into())
    );
    assert!(
        backups[1]["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("manifest.json is missing"),
        "{listed}"
    );

    let scratch = tempfile::tempdir().expect("dir");
    let scratch_dir = scratch.path().display().to_string();
    let verified = json_of(
        &cairn(
            &s3,
            &[
                "backup",
                "verify",
                "--from",
                &format!("{ROOT}/first"),
                "--scratch-dir",
                &scratch_dir,
                "--json",
            ],
        ),
        "cairn backup verify",
    );
    assert_eq!(
        (&verified["verified"], &verified["events"]),
        (&true.into(), &120.into())
    );
    assert_eq!(
        std::fs::read_dir(scratch.path()).expect("list").count(),
        0,
        "the download is removed after the verification"
    );
    let e = refused(
        &cairn(
            &s3,
            &["backup", "verify", "--from", &format!("{ROOT}/partial")],
        ),
        "verify of an incomplete backup",
    );
    assert!(e.contains("manifest.json is missing"), "{e}");

    // A damaged object: verify and restore both refuse it, by name, and write nothing.
    json_of(&backup(&s3, &node, "second"), "cairn backup create");
    let victim = s3
        .objects(BUCKET, "team/orders/second/db/")
        .into_iter()
        .max_by_key(|o| o.size)
        .expect("a table file");
    s3.put(BUCKET, &victim.key, b"not the table file it was");
    let e = refused(
        &cairn(
            &s3,
            &[
                "backup",
                "verify",
                "--from",
                &format!("{ROOT}/second"),
                "--scratch-dir",
                &scratch_dir,
            ],
        ),
        "verify of a damaged backup",
    );
    assert!(e.contains(&victim.key) && e.contains("is damaged"), "{e}");
    let restored_root = tempfile::tempdir().expect("dir");
    let damaged_target = restored_root.path().join("damaged");
    let e = refused(
        &cairn(
            &s3,
            &[
                "restore",
                "--from",
                &format!("{ROOT}/second"),
                "--data-dir",
                &damaged_target.display().to_string(),
            ],
        ),
        "restore of a damaged backup",
    );
    assert!(e.contains("is damaged"), "{e}");
    assert!(
        !damaged_target.exists(),
        "a refused restore creates nothing"
    );

    // Restored from the bucket and served: the source's events, event for event.
    let data = restored_root.path().join("data");
    let restored = json_of(
        &cairn(
            &s3,
            &[
                "restore",
                "--from",
                &format!("{ROOT}/first"),
                "--data-dir",
                &data.display().to_string(),
                "--json",
            ],
        ),
        "cairn restore",
    );
    assert_eq!(restored["events"], 120);
    let leftovers: Vec<_> = std::fs::read_dir(&data)
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".cairn-download"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the download was moved into place: {leftovers:?}"
    );
    let served = Node::spawn(&data, &[]);
    assert!(served.logged("serving a restored backup as a new cluster"));
    let events = all_events(&mut EventStoreClient::new(served.channel().await))
        .await
        .expect("restored events");
    assert_eq!(events.len(), history.len());
    for (got, want) in events.iter().zip(&history) {
        assert_eq!(
            (&got.event_id, &got.data, got.position),
            (&want.event_id, &want.data, want.position)
        );
    }

    // Delete takes one backup, never the prefix that holds several.
    let before = s3.objects(BUCKET, "team/").len();
    let e = refused(
        &cairn(
            &s3,
            &["backup", "delete", "--from", "s3://cairn-backups/team"],
        ),
        "delete of a prefix holding backups",
    );
    assert!(e.contains("is not a backup"), "{e}");
    assert_eq!(
        s3.objects(BUCKET, "team/").len(),
        before,
        "nothing was deleted"
    );
    for name in ["first", "second", "partial"] {
        json_of(
            &cairn(
                &s3,
                &[
                    "backup",
                    "delete",
                    "--from",
                    &format!("{ROOT}/{name}"),
                    "--json",
                ],
            ),
            "cairn backup delete",
        );
    }
    assert!(s3.objects(BUCKET, "team/").is_empty());
    let listed = json_of(
        &cairn(&s3, &["backup", "list", "--from", ROOT, "--json"]),
        "cairn backup list",
    );
    assert_eq!(listed["backups"], serde_json::json!([]));
}
