//! `cairn backup …` and `cairn restore`: take a backup of a running node into a directory,
//! list and verify backups, and turn one into the data directory of a new cluster.
//!
//! A backup lands under `DEST/NAME/`: the files first, each checked against the SHA-256
//! the node computed while sending it, then `manifest.json`, written last and renamed
//! into place, so a backup that was cut off has no manifest and is never mistaken for a
//! complete one. Layout and manifest fields: docs/backup.md.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::backup_client::BackupClient;
use cairn_store::backup::{self as store_backup, MANIFEST_FILE, Manifest, ManifestFile};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::client_cli::ClientPortArgs;
use crate::peer::ClusterIdentity;

/// Flags of `cairn backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// What to do.
    #[command(subcommand)]
    action: BackupAction,
}

/// `cairn backup` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BackupAction {
    /// Take an online, consistent backup of a running node (any member; a follower spares
    /// the leader the disk reads) into a new directory below --to. The node keeps serving.
    Create {
        #[command(flatten)]
        client: Box<ClientPortArgs>,
        /// Directory that holds backups; each backup is a directory below it.
        #[arg(long, env = "CAIRN_BACKUP_TO")]
        to: String,
        /// Name of the new backup (default: cairn-<UTC time>, e.g. cairn-20261207T013000Z).
        #[arg(long, env = "CAIRN_BACKUP_NAME")]
        name: Option<String>,
    },
    /// List the backups below a directory, oldest first, with what each holds.
    List {
        /// Directory that holds backups.
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a backup: its manifest, every file's size and SHA-256, and the checkpoint
    /// opened read-only holding the events, users and indexes the manifest names.
    Verify {
        /// The backup's directory (DEST/NAME).
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Flags of `cairn restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup's directory (DEST/NAME, as `cairn backup list` shows it).
    #[arg(long, env = "CAIRN_RESTORE_FROM")]
    pub from: PathBuf,
    /// Data directory to create (missing or empty), then served by `cairn serve
    /// --data-dir` as a new one-node cluster.
    #[arg(long, env = "CAIRN_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time (UTC), for backup names that sort by time.
pub fn utc_stamp(unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A backup name: one path component, printable, no leading dot.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Where `--to` points.
fn local_destination(to: &str) -> anyhow::Result<PathBuf> {
    if let Some((scheme, _)) = to.split_once("://") {
        bail!(
            "--to {to:?}: {scheme}:// destinations are not supported by this version; give a directory (an S3 bucket can be mounted, or the directory copied with your tools)"
        );
    }
    Ok(PathBuf::from(to))
}

/// Progress on a terminal, a line at the end otherwise.
struct Progress {
    total: u64,
    done: u64,
    shown: Instant,
    terminal: bool,
}

impl Progress {
    fn new(total: u64) -> Self {
        Progress {
            total,
            done: 0,
            shown: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        if self.terminal && self.shown.elapsed().as_millis() >= 200 {
            self.shown = Instant::now();
            let pct = if self.total == 0 {
                100.0
            } else {
                self.done as f64 * 100.0 / self.total as f64
            };
            eprint!("\r{} of {} ({pct:.0}%)   ", mib(self.done), mib(self.total));
            let _ = std::io::stderr().flush();
        }
    }

    fn finish(&self) {
        if self.terminal {
            eprintln!("\r{} of {} (100%)   ", mib(self.done), mib(self.total));
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A file being received.
struct Incoming {
    file: File,
    hasher: Sha256,
    size: u64,
}

/// Receives a backup stream into `dir` (which it creates; it must not exist).
async fn receive(
    mut stream: tonic::Streaming<pb::BackupChunk>,
    dir: &Path,
    client: &ClientPortArgs,
) -> anyhow::Result<Manifest> {
    let mut progress: Option<Progress> = None;
    let mut open: BTreeMap<String, Incoming> = BTreeMap::new();
    let mut received: BTreeMap<String, ManifestFile> = BTreeMap::new();
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => bail!(
                "the node ended the stream before the manifest: the backup in {} is incomplete",
                dir.display()
            ),
            Err(status) => return Err(client.failed(&status)),
        };
        use pb::backup_chunk::Part;
        match chunk.part {
            Some(Part::Started(started)) => {
                progress = Some(Progress::new(started.total_bytes));
            }
            Some(Part::Data(data)) => {
                if !store_backup::valid_file_path(&data.path) || received.contains_key(&data.path) {
                    bail!("the node sent an unexpected file path {:?}", data.path);
                }
                let incoming = match open.entry(data.path.clone()) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let path = dir.join(&data.path);
                        if let Some(parent) = path.parent() {
                            fs::create_dir_all(parent).with_context(|| {
                                format!("failed to create {}", parent.display())
                            })?;
                        }
                        let file = File::create_new(&path)
                            .with_context(|| format!("failed to create {}", path.display()))?;
                        e.insert(Incoming {
                            file,
                            hasher: Sha256::new(),
                            size: 0,
                        })
                    }
                };
                incoming.file.write_all(&data.data).with_context(|| {
                    format!("failed to write {}", dir.join(&data.path).display())
                })?;
                incoming.hasher.update(&data.data);
                incoming.size += data.data.len() as u64;
                if let Some(p) = progress.as_mut() {
                    p.advance(data.data.len() as u64);
                }
            }
            Some(Part::End(end)) => {
                let path = dir.join(&end.path);
                let incoming = match open.remove(&end.path) {
                    Some(incoming) => incoming,
                    // An empty file has no data message.
                    None if store_backup::valid_file_path(&end.path)
                        && !received.contains_key(&end.path) =>
                    {
                        if let Some(parent) = path.parent() {
                            fs::create_dir_all(parent).with_context(|| {
                                format!("failed to create {}", parent.display())
                            })?;
                        }
                        Incoming {
                            file: File::create_new(&path)
                                .with_context(|| format!("failed to create {}", path.display()))?,
                            hasher: Sha256::new(),
                            size: 0,
                        }
                    }
                    None => bail!("the node sent an unexpected file path {:?}", end.path),
                };
                let sha256 = store_backup::hex(&incoming.hasher.finalize());
                if incoming.size != end.size || sha256 != end.sha256 {
                    bail!(
                        "{} arrived damaged: {} bytes with SHA-256 {sha256}, the node sent {} bytes with {}",
                        end.path,
                        incoming.size,
                        end.size,
                        end.sha256
                    );
                }
                incoming
                    .file
                    .sync_all()
                    .with_context(|| format!("failed to sync {}", path.display()))?;
                received.insert(
                    end.path.clone(),
                    ManifestFile {
                        path: end.path,
                        size: end.size,
                        sha256,
                    },
                );
            }
            Some(Part::ManifestJson(text)) => {
                let manifest = Manifest::from_json(&text, "the node's manifest")?;
                let named: BTreeMap<&str, &ManifestFile> = manifest
                    .files
                    .iter()
                    .map(|f| (f.path.as_str(), f))
                    .collect();
                let got: BTreeMap<&str, &ManifestFile> =
                    received.iter().map(|(k, v)| (k.as_str(), v)).collect();
                if named != got || !open.is_empty() {
                    bail!(
                        "the node's manifest names other files than it sent: the backup in {} is incomplete",
                        dir.display()
                    );
                }
                for sub in dirs_below(dir)? {
                    cairn_store::sync_dir(&sub)?;
                }
                store_backup::write_manifest(dir, &manifest)?;
                if let Some(p) = progress.as_ref() {
                    p.finish();
                }
                return Ok(manifest);
            }
            None => bail!("the node sent an empty message"),
        }
    }
}

/// `dir` and every directory below it.
fn dirs_below(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let here = out[i].clone();
        for entry in
            fs::read_dir(&here).with_context(|| format!("failed to list {}", here.display()))?
        {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                out.push(entry.path());
            }
        }
        i += 1;
    }
    Ok(out)
}

fn summary_json(name: &str, manifest: &Manifest) -> serde_json::Value {
    json!({
        "name": name,
        "created_unix_seconds": manifest.created_unix_seconds,
        "cairn_version": manifest.cairn_version,
        "cluster_id": manifest.cluster_id,
        "node_id": manifest.node_id,
        "applied_index": manifest.applied.index,
        "boundaries": manifest.boundaries,
        "events": manifest.total_events(),
        "users": manifest.users,
        "indexes": manifest.indexes,
        "files": manifest.files.len(),
        "bytes": manifest.total_bytes(),
    })
}

fn print_summary(headline: &str, manifest: &Manifest) {
    println!("{headline}");
    println!(
        "taken:        {} (unix {}) on node {} by Cairn {}",
        utc_stamp(manifest.created_unix_seconds),
        manifest.created_unix_seconds,
        manifest.node_id,
        manifest.cairn_version
    );
    println!("log index:    {}", manifest.applied.index);
    println!(
        "contents:     {} events in {} boundaries, {} users, {} indexes",
        manifest.total_events(),
        manifest.boundaries.len(),
        manifest.users,
        manifest.indexes
    );
    for b in &manifest.boundaries {
        println!(
            "  {:<24} {:>12} events, last at {}:{}",
            b.name, b.events, b.last_commit, b.last_prepare
        );
    }
    println!(
        "size:         {} in {} files",
        mib(manifest.total_bytes()),
        manifest.files.len()
    );
}

async fn create(client: ClientPortArgs, to: String, name: Option<String>) -> anyhow::Result<()> {
    let root = local_destination(&to)?;
    let name = name.unwrap_or_else(|| format!("cairn-{}", utc_stamp(now_unix())));
    if !valid_name(&name) {
        bail!(
            "--name {name:?}: a backup name is letters, digits, '-', '_' and '.', not starting with '.'"
        );
    }
    fs::create_dir_all(&root)
        .with_context(|| format!("failed to create --to {}", root.display()))?;
    let dir = root.join(&name);
    fs::create_dir(&dir).with_context(|| {
        format!(
            "failed to create {}: a backup of that name exists already? (--name picks another)",
            dir.display()
        )
    })?;
    let started = Instant::now();
    let (channel, credentials) = client.connect().await?;
    let mut backup = BackupClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(crate::backup::MAX_BACKUP_MESSAGE_BYTES);
    let stream = backup
        .create(pb::CreateBackupRequest {})
        .await
        .map_err(|s| client.failed(&s))
        .with_context(|| format!("the backup in {} was not taken", dir.display()))?
        .into_inner();
    let manifest = match receive(stream, &dir, &client).await {
        Ok(manifest) => manifest,
        Err(e) => {
            return Err(e.context(format!(
                "the backup in {} is incomplete (it has no {MANIFEST_FILE}); remove it",
                dir.display()
            )));
        }
    };
    if client.json {
        let mut out = summary_json(&name, &manifest);
        out["path"] = json!(dir.display().to_string());
        out["seconds"] = json!(started.elapsed().as_secs_f64());
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "backup {} written in {:.1}s",
                dir.display(),
                started.elapsed().as_secs_f64()
            ),
            &manifest,
        );
    }
    Ok(())
}

fn list(from: &Path, as_json: bool) -> anyhow::Result<()> {
    let mut names: Vec<String> = fs::read_dir(from)
        .with_context(|| format!("failed to list --from {}", from.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut rows = Vec::new();
    for name in names {
        let dir = from.join(&name);
        let row = match store_backup::read_manifest(&dir) {
            Ok(manifest) => {
                let mut row = summary_json(&name, &manifest);
                row["complete"] = json!(true);
                row
            }
            Err(e) => json!({"name": name, "complete": false, "problem": e.to_string()}),
        };
        rows.push(row);
    }
    if as_json {
        println!("{}", json!({ "backups": rows }));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no backups in {}", from.display());
    }
    for row in rows {
        if row["complete"] == json!(true) {
            println!(
                "{:<32} {}  index {:>10}  {:>12} events  {}",
                row["name"].as_str().unwrap_or_default(),
                utc_stamp(row["created_unix_seconds"].as_i64().unwrap_or_default()),
                row["applied_index"],
                row["events"],
                mib(row["bytes"].as_u64().unwrap_or_default())
            );
        } else {
            println!(
                "{:<32} INCOMPLETE: {}",
                row["name"].as_str().unwrap_or_default(),
                row["problem"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn verify(from: &Path, as_json: bool) -> anyhow::Result<()> {
    let manifest = store_backup::verify(from)
        .with_context(|| format!("backup {} failed verification", from.display()))?;
    let name = backup_name(from);
    if as_json {
        let mut out = summary_json(&name, &manifest);
        out["verified"] = json!(true);
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "backup {} verified: every file matches its SHA-256, the checkpoint opens and holds what the manifest says",
                from.display()
            ),
            &manifest,
        );
    }
    Ok(())
}

/// The name of the backup in `dir` (its last path component).
fn backup_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Runs `cairn restore`.
pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    if !store_backup::is_empty_dir(&args.data_dir)? {
        bail!(
            "--data-dir {} is not empty: restore only into a new or empty directory (nothing was changed)",
            args.data_dir.display()
        );
    }
    let db = args.data_dir.join("db");
    // Verified before anything is created: a refused backup leaves no directory behind.
    let manifest = store_backup::restore(&args.from, &db).with_context(|| {
        format!(
            "failed to restore {} into {}",
            args.from.display(),
            args.data_dir.display()
        )
    })?;
    crate::data_dir::prepare(&args.data_dir, false)?;
    let cluster_id = ClusterIdentity::create_new(&args.data_dir)?;
    let marker = args.data_dir.join(crate::backup::RESTORED_MARKER);
    let mut record = summary_json(&backup_name(&args.from), &manifest);
    record["from"] = json!(args.from.display().to_string());
    record["new_cluster_id"] = json!(cluster_id);
    fs::write(&marker, format!("{record}\n"))
        .and_then(|_| File::open(&marker)?.sync_all())
        .and_then(|_| File::open(&args.data_dir)?.sync_all())
        .with_context(|| format!("failed to write {}", marker.display()))?;
    if args.json {
        let mut out = summary_json(&backup_name(&args.from), &manifest);
        out["data_dir"] = json!(args.data_dir.display().to_string());
        out["new_cluster_id"] = json!(cluster_id);
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "restored {} into {}",
                args.from.display(),
                args.data_dir.display()
            ),
            &manifest,
        );
        println!(
            "cluster id:   {cluster_id} (new: members of the cluster the backup came from are never let in)"
        );
        println!(
            "next:         cairn serve --data-dir {}   (a new group of one; add members to it as usual)",
            args.data_dir.display()
        );
    }
    Ok(())
}

/// Runs a `cairn backup` subcommand and prints its result.
pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    match args.action {
        BackupAction::Create { client, to, name } => create(*client, to, name).await,
        BackupAction::List { from, json } => list(&from, json),
        BackupAction::Verify { from, json } => verify(&from, json),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn names_sort_by_time_in_utc() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_796_520_930), "20261206T013530Z");
        assert!(utc_stamp(1_796_520_930) < utc_stamp(1_796_520_931));
    }

    #[test]
    fn a_name_is_one_path_component() {
        assert!(valid_name("cairn-20261207T013000Z"));
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "x\\y"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_object_store_url_is_refused_with_the_reason() {
        let e = local_destination("s3://bucket/prefix").unwrap_err();
        assert!(e.to_string().contains("s3:// destinations"), "{e}");
        assert_eq!(
            local_destination("/backups").unwrap(),
            PathBuf::from("/backups")
        );
    }

    #[test]
    fn create_takes_client_port_flags_and_a_destination() {
        let cli = Cli::try_parse_from([
            "cairn",
            "backup",
            "create",
            "--to",
            "/b",
            "--endpoint",
            "db:5005",
            "--password",
            "pw",
        ])
        .expect("valid");
        match cli.command {
            Command::Backup(BackupArgs {
                action: BackupAction::Create { client, to, name },
            }) => {
                assert_eq!((client.endpoint.as_str(), to.as_str()), ("db:5005", "/b"));
                assert_eq!(name, None);
            }
            other => panic!("not backup create: {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["cairn", "backup", "create"]).is_err(),
            "--to is required"
        );
        assert!(Cli::try_parse_from(["cairn", "restore", "--from", "/b/x"]).is_err());
    }
}
