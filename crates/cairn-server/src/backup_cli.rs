//! `cairn backup …` and `cairn restore`: take a backup of a running node into a directory
//! or an S3 bucket, list, verify and delete backups, and turn one into the data directory
//! of a new cluster.
//!
//! A backup lands under `DEST/NAME/`: the files first, each checked against the SHA-256
//! the node computed while sending it, then `manifest.json`, written last, so a backup
//! that was cut off has no manifest and is never mistaken for a complete one. Where
//! backups are kept: [`crate::backup_target`]. Layout and manifest fields: docs/backup.md.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::backup_client::BackupClient;
use cairn_store::backup::{self as store_backup, MANIFEST_FILE, Manifest, ManifestFile};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::backup_target::{BackupWriter, FileWriter, LocalCopy, Location, S3Args, Transfer};
use crate::client_cli::ClientPortArgs;
use crate::peer::ClusterIdentity;
use cairn_raft::archive::{Replayed, Segment, Target, parse_segment_name};

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
    /// the leader the disk reads) into a new backup below --to. The node keeps serving.
    Create {
        #[command(flatten)]
        client: Box<ClientPortArgs>,
        /// Where backups are kept: a directory, or s3://BUCKET/PREFIX (credentials from
        /// the standard AWS environment variables); each backup is a directory or key
        /// prefix below it.
        #[arg(long, env = "CAIRN_BACKUP_TO")]
        to: String,
        /// Name of the new backup (default: cairn-<UTC time>, e.g. cairn-20261207T013000Z).
        #[arg(long, env = "CAIRN_BACKUP_NAME")]
        name: Option<String>,
        #[command(flatten)]
        s3: S3Args,
        #[command(flatten)]
        result: ResultFile,
    },
    /// List the backups below a directory or s3:// prefix, oldest first, with what each
    /// holds; a backup without its manifest is shown as incomplete.
    List {
        /// A directory or s3://BUCKET/PREFIX that holds backups.
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        s3: S3Args,
    },
    /// Check a backup: its manifest, every file's size and SHA-256, and the checkpoint
    /// opened read-only holding the events, users and indexes the manifest names. A
    /// backup in a bucket is downloaded first (below --scratch-dir) and removed after.
    Verify {
        /// The backup (DEST/NAME, as `cairn backup list` shows it); with --newest, the
        /// location holding backups (DEST).
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: String,
        /// Verify the newest complete backup below --from.
        #[arg(long)]
        newest: bool,
        /// Once verified, record it in the backup (verified.json beside the manifest):
        /// `cairn backup prune` lets older backups go only behind a recorded one.
        #[arg(long)]
        record: bool,
        #[command(flatten)]
        result: ResultFile,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Directory to download a backup from a bucket into; needs room for the whole
        /// backup (default: the system's temporary directory).
        #[arg(long, env = "CAIRN_BACKUP_SCRATCH_DIR")]
        scratch_dir: Option<PathBuf>,
        #[command(flatten)]
        s3: S3Args,
    },
    /// Delete the complete backups below a location that retention no longer keeps, and
    /// only those older than the newest verified one (`verify --record`): backups are
    /// never pruned on the strength of a backup nobody has restored. Kept: the newest
    /// --keep-last, those younger than --keep-within, the newest verified and every
    /// backup after it. Incomplete backups are left alone (one may be under way).
    Prune {
        /// A directory or s3://BUCKET/PREFIX that holds backups.
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: String,
        /// Complete backups to keep, newest first (at least 1).
        #[arg(long, env = "CAIRN_BACKUP_KEEP_LAST", value_parser = clap::value_parser!(u64).range(1..))]
        keep_last: u64,
        /// Also keep every backup younger than this age (90m, 12h, 30d, 2w).
        #[arg(long, env = "CAIRN_BACKUP_KEEP_WITHIN", value_parser = parse_age_flag)]
        keep_within: Option<u64>,
        /// Say what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        s3: S3Args,
        #[command(flatten)]
        result: ResultFile,
    },
    /// Delete a backup, complete or not: its manifest first, then its files. Refuses a
    /// location that holds anything else than a backup does.
    Delete {
        /// The backup (DEST/NAME, as `cairn backup list` shows it).
        #[arg(long, env = "CAIRN_BACKUP_FROM")]
        from: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        s3: S3Args,
    },
}

/// Where a one-shot run leaves its outcome for whoever started it: in a Kubernetes pod,
/// `/dev/termination-log`, which the pod's status then carries (the operator reads it).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ResultFile {
    /// Also write the outcome to this file as one JSON object (`{"error": "…"}` on
    /// failure), at most 4 KiB: e.g. /dev/termination-log in a Kubernetes pod.
    #[arg(long, env = "CAIRN_RESULT_FILE")]
    pub result_file: Option<PathBuf>,
}

/// Kubernetes keeps at most 4096 bytes of a termination message.
const RESULT_FILE_MAX_BYTES: usize = 4096;

impl ResultFile {
    /// Writes `outcome` (lists dropped first when it would not fit), reporting a failure to
    /// write without hiding the outcome itself.
    fn write(&self, outcome: &anyhow::Result<serde_json::Value>) {
        let Some(path) = &self.result_file else {
            return;
        };
        let mut value = match outcome {
            Ok(value) => value.clone(),
            Err(e) => json!({ "error": format!("{e:#}") }),
        };
        let mut text = value.to_string();
        if text.len() > RESULT_FILE_MAX_BYTES {
            if let Some(object) = value.as_object_mut() {
                object.retain(|_, v| !v.is_array() && !v.is_object());
                object.insert("truncated".into(), json!(true));
                if let Some(serde_json::Value::String(error)) = object.get_mut("error") {
                    let mut cut = RESULT_FILE_MAX_BYTES / 2;
                    while !error.is_char_boundary(cut.min(error.len())) {
                        cut -= 1;
                    }
                    error.truncate(cut);
                }
            }
            text = value.to_string();
        }
        if let Err(e) = fs::write(path, text) {
            eprintln!(
                "warning: failed to write the outcome to {}: {e}",
                path.display()
            );
        }
    }
}

fn parse_age_flag(text: &str) -> Result<u64, String> {
    cairn_core::age::parse_age(text)
}

/// Flags of `cairn restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup (DEST/NAME, as `cairn backup list` shows it): a directory or
    /// s3://BUCKET/PREFIX/NAME; or a location holding backups (DEST), whose newest complete
    /// backup (before --to-position) is used. One in a bucket is downloaded into
    /// --data-dir first.
    #[arg(long, env = "CAIRN_RESTORE_FROM")]
    pub from: String,
    /// Data directory to create (missing or empty), then served by `cairn serve
    /// --data-dir` as a new one-node cluster.
    #[arg(long, env = "CAIRN_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Replay the archive after the backup up to this position of --boundary:
    /// `COMMIT:PREPARE` restores every event at or before it and none after (a write is
    /// kept or dropped whole); `end` replays all the archive holds. With a --from that
    /// holds backups rather than being one, the newest backup before the position is used.
    #[arg(long, env = "CAIRN_RESTORE_TO_POSITION", requires = "archive_from")]
    pub to_position: Option<String>,
    /// The boundary whose position --to-position is.
    #[arg(long, env = "CAIRN_RESTORE_BOUNDARY")]
    pub boundary: Option<String>,
    /// The archive to replay: the --archive-to of the cluster the backup came from (a
    /// directory or s3://BUCKET/PREFIX).
    #[arg(long, env = "CAIRN_RESTORE_ARCHIVE_FROM", requires = "to_position")]
    pub archive_from: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub s3: S3Args,
}

/// How far `cairn restore` replays the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RestorePoint {
    /// The backup as it is.
    Backup,
    /// Everything the archive holds.
    End,
    /// Up to a position.
    Position(Target),
}

impl RestorePoint {
    fn of(args: &RestoreArgs) -> anyhow::Result<RestorePoint> {
        match args.to_position.as_deref() {
            None => {
                if args.boundary.is_some() {
                    bail!("--boundary goes with --to-position");
                }
                Ok(RestorePoint::Backup)
            }
            Some("end") => Ok(RestorePoint::End),
            Some(text) => {
                let position = cairn_core::position::parse_write_id(text).map_err(|_| {
                    anyhow::anyhow!(
                        "--to-position {text:?}: give COMMIT:PREPARE (e.g. 1200:1199, as positions are written) or end"
                    )
                })?;
                let boundary = args.boundary.clone().context(
                    "--to-position COMMIT:PREPARE needs --boundary: positions are counted per boundary",
                )?;
                Ok(RestorePoint::Position(Target { boundary, position }))
            }
        }
    }

    /// What to replay the archive to: `None` for no replay, `Some(None)` for all of it.
    fn replay_target(&self) -> Option<Option<Target>> {
        match self {
            RestorePoint::Backup => None,
            RestorePoint::End => Some(None),
            RestorePoint::Position(target) => Some(Some(target.clone())),
        }
    }

    /// Whether a backup can be the base of this point: it holds no event after it.
    fn admits(&self, manifest: &Manifest) -> bool {
        match self {
            RestorePoint::Position(target) => manifest
                .boundaries
                .iter()
                .find(|b| b.name == target.boundary)
                .is_none_or(|b| {
                    cairn_core::Position::new(b.last_commit, b.last_prepare) <= target.position
                }),
            _ => true,
        }
    }
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

/// A progress display fed by a download's [`Transfer`]s.
fn download_progress() -> impl FnMut(Transfer) {
    let mut progress: Option<Progress> = None;
    move |transfer| match transfer {
        Transfer::Started(total) => {
            if std::io::stderr().is_terminal() {
                eprintln!("downloading {}", mib(total));
            }
            progress = Some(Progress::new(total));
        }
        Transfer::Moved(bytes) => {
            if let Some(p) = progress.as_mut() {
                p.advance(bytes);
            }
        }
        Transfer::Done => {
            if let Some(p) = progress.as_ref() {
                p.finish();
            }
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A file being received.
struct Incoming {
    file: FileWriter,
    hasher: Sha256,
    size: u64,
}

/// Receives a backup stream through `writer`. When it fails, uploads in progress are
/// aborted; the files already whole stay, without a manifest (an incomplete backup).
async fn receive(
    stream: tonic::Streaming<pb::BackupChunk>,
    writer: &BackupWriter,
    client: &ClientPortArgs,
) -> anyhow::Result<Manifest> {
    let mut open: BTreeMap<String, Incoming> = BTreeMap::new();
    let received = receive_files(stream, writer, client, &mut open).await;
    if received.is_err() {
        for (_, incoming) in std::mem::take(&mut open) {
            incoming.file.abort().await;
        }
    }
    received
}

async fn receive_files(
    mut stream: tonic::Streaming<pb::BackupChunk>,
    writer: &BackupWriter,
    client: &ClientPortArgs,
    open: &mut BTreeMap<String, Incoming>,
) -> anyhow::Result<Manifest> {
    let mut progress: Option<Progress> = None;
    let mut received: BTreeMap<String, ManifestFile> = BTreeMap::new();
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => bail!(
                "the node ended the stream before the manifest: the backup in {} is incomplete",
                writer.display()
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
                    std::collections::btree_map::Entry::Vacant(e) => e.insert(Incoming {
                        file: writer.open(&data.path)?,
                        hasher: Sha256::new(),
                        size: 0,
                    }),
                };
                incoming.hasher.update(&data.data);
                incoming.size += data.data.len() as u64;
                let len = data.data.len() as u64;
                incoming.file.write(data.data).await?;
                if let Some(p) = progress.as_mut() {
                    p.advance(len);
                }
            }
            Some(Part::End(end)) => {
                let incoming = match open.remove(&end.path) {
                    Some(incoming) => incoming,
                    // An empty file has no data message.
                    None if store_backup::valid_file_path(&end.path)
                        && !received.contains_key(&end.path) =>
                    {
                        Incoming {
                            file: writer.open(&end.path)?,
                            hasher: Sha256::new(),
                            size: 0,
                        }
                    }
                    None => bail!("the node sent an unexpected file path {:?}", end.path),
                };
                let sha256 = store_backup::hex(&incoming.hasher.finalize());
                if incoming.size != end.size || sha256 != end.sha256 {
                    incoming.file.abort().await;
                    bail!(
                        "{} arrived damaged: {} bytes with SHA-256 {sha256}, the node sent {} bytes with {}",
                        end.path,
                        incoming.size,
                        end.size,
                        end.sha256
                    );
                }
                incoming.file.finish().await?;
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
                        writer.display()
                    );
                }
                writer.commit(&manifest).await?;
                if let Some(p) = progress.as_ref() {
                    p.finish();
                }
                return Ok(manifest);
            }
            None => bail!("the node sent an empty message"),
        }
    }
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

async fn create(
    client: ClientPortArgs,
    to: String,
    name: Option<String>,
    s3: S3Args,
) -> anyhow::Result<serde_json::Value> {
    let root = Location::parse(&to, &s3).context("--to")?;
    let name = name.unwrap_or_else(|| format!("cairn-{}", utc_stamp(now_unix())));
    if !valid_name(&name) {
        bail!(
            "--name {name:?}: a backup name is letters, digits, '-', '_' and '.', not starting with '.'"
        );
    }
    let location = root.join(&name);
    // Before the node is asked for anything: a destination that cannot be written (no
    // bucket, no credentials, a name in use) costs the node no checkpoint.
    let writer = BackupWriter::start(&location).await?;
    let started = Instant::now();
    let (channel, credentials) = client.connect().await?;
    let mut backup = BackupClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(crate::backup::MAX_BACKUP_MESSAGE_BYTES);
    let incomplete = || {
        format!(
            "the backup {} is incomplete (it has no {MANIFEST_FILE}); `cairn backup delete --from {}` removes it",
            location.display(),
            location.display()
        )
    };
    let stream = backup
        .create(pb::CreateBackupRequest {})
        .await
        .map_err(|s| client.failed(&s))
        .with_context(incomplete)?
        .into_inner();
    let manifest = receive(stream, &writer, &client)
        .await
        .with_context(incomplete)?;
    let mut out = summary_json(&name, &manifest);
    out["path"] = json!(location.display());
    out["seconds"] = json!(started.elapsed().as_secs_f64());
    if client.json {
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "backup {} written in {:.1}s",
                location.display(),
                started.elapsed().as_secs_f64()
            ),
            &manifest,
        );
    }
    Ok(out)
}

async fn list(from: &str, as_json: bool, s3: &S3Args) -> anyhow::Result<()> {
    let location = Location::parse(from, s3).context("--from")?;
    let mut rows = Vec::new();
    for (name, manifest) in location.backups().await? {
        let row = match manifest {
            Ok(manifest) => {
                let mut row = summary_json(&name, &manifest);
                row["complete"] = json!(true);
                row
            }
            Err(problem) => json!({"name": name, "complete": false, "problem": problem}),
        };
        rows.push(row);
    }
    if as_json {
        println!("{}", json!({ "backups": rows }));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no backups in {}", location.display());
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

/// Runs a blocking store call (hashing and opening a checkpoint) off the async runtime.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .context("the backup task failed")?
}

/// How `cairn backup verify` runs.
struct VerifyRun {
    newest: bool,
    record: bool,
    as_json: bool,
    scratch: Option<PathBuf>,
}

/// The name of the newest complete backup below `root` that `admits`, by the log index it
/// holds (then the time it was taken): what `verify --newest` checks and what a restore
/// from a location starts from.
async fn newest_backup(
    root: &Location,
    admits: impl Fn(&Manifest) -> bool,
) -> anyhow::Result<Option<String>> {
    Ok(root
        .backups()
        .await?
        .into_iter()
        .filter_map(|(name, manifest)| manifest.ok().map(|m| (name, m)))
        .filter(|(_, manifest)| admits(manifest))
        .max_by_key(|(_, m)| (m.applied.index, m.created_unix_seconds))
        .map(|(name, _)| name))
}

async fn verify(from: &str, run: VerifyRun, s3: &S3Args) -> anyhow::Result<serde_json::Value> {
    let given = Location::parse(from, s3).context("--from")?;
    let location = if run.newest {
        let name = newest_backup(&given, |_| true)
            .await?
            .with_context(|| format!("{} holds no complete backup", given.display()))?;
        given.join(&name)
    } else {
        given
    };
    let (as_json, scratch) = (run.as_json, run.scratch);
    let scratch = scratch.unwrap_or_else(std::env::temp_dir);
    let local = location
        .local_copy(&scratch, &mut download_progress())
        .await
        .with_context(|| format!("backup {} failed verification", location.display()))?;
    let dir = local.path().to_path_buf();
    let manifest = blocking(move || store_backup::verify(&dir).map_err(anyhow::Error::from))
        .await
        .with_context(|| format!("backup {} failed verification", location.display()))?;
    drop(local);
    let name = location.name();
    let mut out = summary_json(&name, &manifest);
    out["path"] = json!(location.display());
    out["verified"] = json!(true);
    if run.record {
        let verified_at = now_unix();
        let record = json!({
            "verified_unix_seconds": verified_at,
            "cairn_version": env!("CARGO_PKG_VERSION"),
        });
        location
            .put_whole(store_backup::VERIFIED_FILE, record.to_string().into_bytes())
            .await
            .with_context(|| {
                format!(
                    "backup {} verified, but recording it failed",
                    location.display()
                )
            })?;
        out["verified_unix_seconds"] = json!(verified_at);
    }
    if as_json {
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "backup {} verified: every file matches its SHA-256, the checkpoint opens and holds what the manifest says",
                location.display()
            ),
            &manifest,
        );
        if run.record {
            println!(
                "recorded:     {}/{}",
                location.display(),
                store_backup::VERIFIED_FILE
            );
        }
    }
    Ok(out)
}

/// A complete backup as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Retained {
    name: String,
    created_unix_seconds: i64,
    verified: bool,
}

/// Retention's rule, in one place: the backups that may go. Kept are the newest
/// `keep_last`, those younger than `keep_within` seconds, the newest verified backup and
/// every backup after it; with no verified backup, all.
fn prunable(
    mut backups: Vec<Retained>,
    keep_last: u64,
    keep_within: Option<u64>,
    now: i64,
) -> Vec<Retained> {
    backups
        .sort_by(|a, b| (a.created_unix_seconds, &a.name).cmp(&(b.created_unix_seconds, &b.name)));
    let Some(newest_verified) = backups.iter().rposition(|b| b.verified) else {
        return Vec::new();
    };
    let by_count = backups
        .len()
        .saturating_sub(usize::try_from(keep_last).unwrap_or(usize::MAX));
    let young = |b: &Retained| {
        keep_within.is_some_and(|age| {
            now.saturating_sub(b.created_unix_seconds) < i64::try_from(age).unwrap_or(i64::MAX)
        })
    };
    backups
        .into_iter()
        .enumerate()
        .filter(|(i, b)| *i < newest_verified && *i < by_count && !young(b))
        .map(|(_, b)| b)
        .collect()
}

/// How `cairn backup prune` runs.
struct PruneRun {
    keep_last: u64,
    keep_within: Option<u64>,
    dry_run: bool,
    as_json: bool,
}

async fn prune(from: &str, run: PruneRun, s3: &S3Args) -> anyhow::Result<serde_json::Value> {
    let root = Location::parse(from, s3).context("--from")?;
    let mut complete = Vec::new();
    for (name, manifest) in root.backups().await? {
        let Ok(manifest) = manifest else { continue };
        let verified = root
            .join(&name)
            .get_whole(store_backup::VERIFIED_FILE)
            .await
            .with_context(|| format!("failed to read whether {name} was verified"))?
            .is_some();
        complete.push(Retained {
            name,
            created_unix_seconds: manifest.created_unix_seconds,
            verified,
        });
    }
    let newest_verified = complete
        .iter()
        .filter(|b| b.verified)
        .max_by_key(|b| (b.created_unix_seconds, b.name.clone()))
        .map(|b| b.name.clone());
    let going = prunable(complete.clone(), run.keep_last, run.keep_within, now_unix());
    let mut deleted = Vec::new();
    for backup in &going {
        let location = root.join(&backup.name);
        if !run.dry_run {
            location
                .delete()
                .await
                .with_context(|| format!("failed to prune {}", location.display()))?;
        }
        if !run.as_json {
            let verb = if run.dry_run {
                "would delete"
            } else {
                "deleted"
            };
            println!("{verb} {}", location.display());
        }
        deleted.push(backup.name.clone());
    }
    let out = json!({
        "location": root.display(),
        "deleted": deleted,
        "kept": complete.len() - going.len(),
        "newest_verified": newest_verified,
        "dry_run": run.dry_run,
    });
    if run.as_json {
        println!("{out}");
    } else if newest_verified.is_none() {
        println!(
            "no verified backup in {}: nothing is pruned until one is (`cairn backup verify --newest --record --from {}`)",
            root.display(),
            root.display()
        );
    } else {
        println!(
            "{} backups kept in {}, {} {}",
            complete.len() - going.len(),
            root.display(),
            going.len(),
            if run.dry_run { "would go" } else { "pruned" }
        );
    }
    Ok(out)
}

async fn delete(from: &str, as_json: bool, s3: &S3Args) -> anyhow::Result<()> {
    let location = Location::parse(from, s3).context("--from")?;
    let removed = location.delete().await?;
    if as_json {
        println!(
            "{}",
            json!({"deleted": location.display(), "name": location.name(), "files": removed})
        );
    } else {
        println!("deleted backup {} ({removed} files)", location.display());
    }
    Ok(())
}

/// Runs `cairn restore`.
pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let point = RestorePoint::of(&args)?;
    let given = Location::parse(&args.from, &args.s3).context("--from")?;
    if !store_backup::is_empty_dir(&args.data_dir)? {
        bail!(
            "--data-dir {} is not empty: restore only into a new or empty directory (nothing was changed)",
            args.data_dir.display()
        );
    }
    let location = base_backup(given, &point).await?;
    let created = !args.data_dir.exists();
    let restored = restore_into(&location, &args, &point).await;
    if restored.is_err() && created {
        // A refused or failed restore leaves no directory behind, not even a download.
        let _ = fs::remove_dir_all(&args.data_dir);
    }
    let (manifest, cluster_id, replayed) = restored?;
    let name = location.name();
    if args.json {
        let mut out = summary_json(&name, &manifest);
        out["data_dir"] = json!(args.data_dir.display().to_string());
        out["new_cluster_id"] = json!(cluster_id);
        if let Some(replayed) = &replayed {
            out["replayed"] = replayed_json(replayed);
        }
        println!("{out}");
    } else {
        print_summary(
            &format!(
                "restored {} into {}",
                location.display(),
                args.data_dir.display()
            ),
            &manifest,
        );
        if let Some(replayed) = &replayed {
            println!(
                "replayed:     {} archived entries after the backup, through log index {}",
                replayed.entries, replayed.last_index
            );
            if let (RestorePoint::Position(target), Some(last)) = (&point, replayed.last_event) {
                println!(
                    "position:     boundary {} ends at {}:{} (asked: up to {}:{})",
                    target.boundary,
                    last.commit,
                    last.prepare,
                    target.position.commit,
                    target.position.prepare
                );
            }
        }
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

/// `cairn serve --restore-from`: before the node's first start, restore the backup into
/// its data directory, as `cairn restore` would. Into a sibling directory first, moved
/// into place whole: a start cut off mid-restore (a pod killed by its liveness probe)
/// leaves an empty data directory, so the next start restores again rather than serving
/// half a backup or nothing.
pub async fn restore_on_first_start(config: &crate::config::ServeConfig) -> anyhow::Result<()> {
    let Some(start_from) = &config.restore else {
        return Ok(());
    };
    let data_dir = &config.data_dir;
    if let Some(crate::config::Membership::Join(_)) = config.cluster.as_ref().map(|c| &c.membership)
    {
        tracing::info!(
            "--restore-from is not for this node: it joins a group, whose state it copies"
        );
        return Ok(());
    }
    if !store_backup::is_empty_dir(data_dir)? {
        tracing::info!(
            data_dir = %data_dir.display(),
            "--restore-from ignored: the data directory already holds a node's data"
        );
        return Ok(());
    }
    let file_name = data_dir
        .file_name()
        .with_context(|| format!("--data-dir {} has no name", data_dir.display()))?;
    let staging = data_dir.with_file_name(format!("{}.restoring", file_name.to_string_lossy()));
    match fs::remove_dir_all(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| {
                format!(
                    "failed to remove the earlier partial restore {}",
                    staging.display()
                )
            });
        }
        _ => {}
    }
    tracing::info!(from = %start_from.from, "restoring a backup before the first start");
    restore(RestoreArgs {
        from: start_from.from.clone(),
        data_dir: staging.clone(),
        to_position: start_from.to_position.clone(),
        boundary: start_from.boundary.clone(),
        archive_from: start_from.archive_from.clone(),
        json: false,
        s3: start_from.s3.clone(),
    })
    .await
    .context("failed to restore --restore-from before the first start")?;
    if data_dir.exists() {
        fs::remove_dir(data_dir)
            .with_context(|| format!("failed to replace {}", data_dir.display()))?;
    }
    fs::rename(&staging, data_dir).with_context(|| {
        format!(
            "failed to move the restored {} to {}",
            staging.display(),
            data_dir.display()
        )
    })?;
    if let Some(parent) = data_dir.parent() {
        cairn_store::sync_dir(parent)
            .with_context(|| format!("failed to sync {}", parent.display()))?;
    }
    tracing::info!(data_dir = %data_dir.display(), "restored; starting as a new cluster");
    Ok(())
}

fn replayed_json(replayed: &Replayed) -> serde_json::Value {
    json!({
        "entries": replayed.entries,
        "last_index": replayed.last_index,
        "last_event": replayed.last_event.map(|p| format!("{}:{}", p.commit, p.prepare)),
    })
}

/// The backup to restore: `given` itself if it is one; otherwise, to replay the archive
/// to a point, the newest complete backup below it that holds nothing after the point.
async fn base_backup(given: Location, point: &RestorePoint) -> anyhow::Result<Location> {
    if given.get_whole(MANIFEST_FILE).await?.is_some() {
        return Ok(given);
    }
    match newest_backup(&given, |manifest| point.admits(manifest)).await? {
        Some(name) => {
            let which = match point {
                RestorePoint::Position(_) => "the newest before the position",
                _ => "the newest",
            };
            eprintln!("base backup:  {} ({which})", given.join(&name).display());
            Ok(given.join(&name))
        }
        None => bail!(
            "{} is no complete backup and holds none{}",
            given.display(),
            match point {
                RestorePoint::Position(_) =>
                    " before the position: nothing to replay the archive onto",
                _ => "",
            }
        ),
    }
}

/// Segments in flight between the download and the replay.
const REPLAY_QUEUE: usize = 4096;

/// Replays the archive of the backup's cluster onto the restored store in `db`.
async fn replay_archive(
    manifest: &Manifest,
    db: PathBuf,
    archive_from: &str,
    s3: &S3Args,
    target: Option<Target>,
) -> anyhow::Result<Replayed> {
    let root = Location::parse(archive_from, s3).context("--archive-from")?;
    let archive = crate::archive::cluster_archive(&root, manifest.cluster_id.as_deref());
    let wanted_id = manifest
        .cluster_id
        .clone()
        .unwrap_or_else(|| crate::archive::UNNAMED_CLUSTER.to_string());
    let from = manifest
        .applied
        .partial_entry
        .map_or(manifest.applied.index + 1, |(i, _)| i);
    let mut segments: Vec<(u64, u64, String)> = archive
        .names_below(crate::archive::SEGMENTS_DIR)
        .await?
        .into_iter()
        .filter_map(|name| parse_segment_name(&name).map(|(a, b)| (a, b, name)))
        .filter(|(_, last, _)| *last >= from)
        .collect();
    segments.sort();
    if segments.is_empty() {
        bail!(
            "{} holds no archived entries after the backup's log index {}: is --archive-from the cluster's --archive-to?",
            archive.display(),
            manifest.applied.index
        );
    }
    let total = segments.len();
    let (tx, rx) = std::sync::mpsc::sync_channel(REPLAY_QUEUE);
    let download = {
        let archive = archive.clone();
        tokio::spawn(async move {
            let terminal = std::io::stderr().is_terminal();
            for (done, (_, _, name)) in segments.into_iter().enumerate() {
                if terminal {
                    eprint!("\rreplaying archive segment {} of {total}   ", done + 1);
                    let _ = std::io::stderr().flush();
                }
                let rel = format!("{}/{name}", crate::archive::SEGMENTS_DIR);
                let fetched = match archive.get_whole(&rel).await {
                    Ok(Some(bytes)) => Segment::decode(&name, &bytes).and_then(|segment| {
                        if segment.cluster_id == wanted_id {
                            Ok(segment)
                        } else {
                            Err(cairn_raft::archive::ArchiveError::Damaged {
                                name: name.clone(),
                                detail: format!(
                                    "it belongs to cluster {}, the backup to {wanted_id}",
                                    segment.cluster_id
                                ),
                            })
                        }
                    }),
                    Ok(None) => Err(cairn_raft::archive::ArchiveError::Damaged {
                        name: name.clone(),
                        detail: "it went missing while the restore read the archive".into(),
                    }),
                    Err(e) => Err(cairn_raft::archive::ArchiveError::Damaged {
                        name: name.clone(),
                        detail: format!("{e:#}"),
                    }),
                };
                match fetched {
                    Ok(segment) => {
                        for entry in segment.entries {
                            if tx.send(Ok(entry)).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
            if terminal {
                eprintln!();
            }
        })
    };
    let replayed = blocking(move || {
        let store = cairn_store::Store::open(&db, &cairn_store::StoreOptions::default())?;
        let replayed = cairn_raft::archive::replay(&store, rx, target.as_ref())?;
        // The restored state belongs to no log from here on (see store_backup::restore).
        store.forget_log_position()?;
        Ok(replayed)
    })
    .await;
    download.abort();
    replayed.with_context(|| format!("failed to replay {}", archive.display()))
}

async fn restore_into(
    location: &Location,
    args: &RestoreArgs,
    point: &RestorePoint,
) -> anyhow::Result<(Manifest, String, Option<Replayed>)> {
    let failed = || {
        format!(
            "failed to restore {} into {}",
            location.display(),
            args.data_dir.display()
        )
    };
    // A download goes into the data directory itself, so its files are moved into place
    // rather than copied: a restore from a bucket needs room for the backup once.
    let local = location
        .local_copy(&args.data_dir, &mut download_progress())
        .await
        .with_context(failed)?;
    let db = args.data_dir.join(store_backup::DB_DIR);
    let (from, moving) = match &local {
        LocalCopy::InPlace(dir) => (dir.clone(), false),
        LocalCopy::Downloaded(dir) => (dir.path().to_path_buf(), true),
    };
    // Verified before anything is created: a refused backup leaves no directory behind.
    let restore_db = db.clone();
    let replaying = point.replay_target().is_some();
    let manifest = blocking(move || {
        if replaying {
            store_backup::restore_for_replay(&from, &restore_db, moving)
        } else if moving {
            store_backup::restore_by_moving(&from, &restore_db)
        } else {
            store_backup::restore(&from, &restore_db)
        }
        .map_err(anyhow::Error::from)
    })
    .await
    .with_context(failed)?;
    drop(local);
    let replayed = match (point.replay_target(), &args.archive_from) {
        (Some(target), Some(archive)) => {
            Some(replay_archive(&manifest, db, archive, &args.s3, target).await?)
        }
        _ => None,
    };
    crate::data_dir::prepare(&args.data_dir, false)?;
    let cluster_id = ClusterIdentity::create_new(&args.data_dir)?;
    let marker = args.data_dir.join(crate::backup::RESTORED_MARKER);
    let mut record = summary_json(&location.name(), &manifest);
    record["from"] = json!(location.display());
    record["new_cluster_id"] = json!(cluster_id);
    if let Some(replayed) = &replayed {
        record["replayed"] = replayed_json(replayed);
    }
    fs::write(&marker, format!("{record}\n"))
        .and_then(|_| File::open(&marker)?.sync_all())
        .and_then(|_| File::open(&args.data_dir)?.sync_all())
        .with_context(|| format!("failed to write {}", marker.display()))?;
    Ok((manifest, cluster_id, replayed))
}

/// Runs a `cairn backup` subcommand and prints its result.
pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    let (result, outcome) = match args.action {
        BackupAction::Create {
            client,
            to,
            name,
            s3,
            result,
        } => (result, create(*client, to, name, s3).await),
        BackupAction::Verify {
            from,
            newest,
            record,
            result,
            json,
            scratch_dir,
            s3,
        } => {
            let run = VerifyRun {
                newest,
                record,
                as_json: json,
                scratch: scratch_dir,
            };
            (result, verify(&from, run, &s3).await)
        }
        BackupAction::Prune {
            from,
            keep_last,
            keep_within,
            dry_run,
            json,
            s3,
            result,
        } => {
            let run = PruneRun {
                keep_last,
                keep_within,
                dry_run,
                as_json: json,
            };
            (result, prune(&from, run, &s3).await)
        }
        BackupAction::List { from, json, s3 } => return list(&from, json, &s3).await,
        BackupAction::Delete { from, json, s3 } => return delete(&from, json, &s3).await,
    };
    result.write(&outcome);
    outcome.map(|_| ())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn retention_keeps_the_young_the_last_and_all_from_the_newest_verified_on() {
        let backup = |name: &str, created: i64, verified: bool| Retained {
            name: name.into(),
            created_unix_seconds: created,
            verified,
        };
        let all = vec![
            backup("d", 400, false),
            backup("a", 100, true),
            backup("c", 300, true),
            backup("b", 200, false),
            backup("e", 500, false),
        ];
        let names = |kept: Vec<Retained>| kept.into_iter().map(|b| b.name).collect::<Vec<_>>();
        // Behind the newest verified (c): a and b; keep-last 1 keeps only e otherwise.
        assert_eq!(names(prunable(all.clone(), 1, None, 1000)), ["a", "b"]);
        // keep-last 4 keeps b too.
        assert_eq!(names(prunable(all.clone(), 4, None, 1000)), ["a"]);
        // Younger than 850 s at t=1000: b (800 s old) stays, a (900 s) goes.
        assert_eq!(names(prunable(all.clone(), 1, Some(850), 1000)), ["a"]);
        // Nothing verified: nothing goes.
        let unverified = all
            .into_iter()
            .map(|b| Retained {
                verified: false,
                ..b
            })
            .collect();
        assert!(prunable(unverified, 1, None, 1000).is_empty());
    }

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
    fn every_subcommand_takes_a_bucket_and_its_endpoint() {
        for argv in [
            &["cairn", "backup", "list", "--from", "s3://b/p"][..],
            &[
                "cairn",
                "backup",
                "verify",
                "--from",
                "s3://b/p/n",
                "--scratch-dir",
                "/t",
            ],
            &["cairn", "backup", "delete", "--from", "s3://b/p/n"],
            &[
                "cairn",
                "restore",
                "--from",
                "s3://b/p/n",
                "--data-dir",
                "/d",
            ],
        ] {
            let mut argv = argv.to_vec();
            argv.extend(["--s3-endpoint", "http://minio:9000", "--s3-part-mib", "8"]);
            assert!(Cli::try_parse_from(&argv).is_ok(), "{argv:?}");
        }
        let small = Cli::try_parse_from([
            "cairn",
            "backup",
            "list",
            "--from",
            "s3://b",
            "--s3-part-mib",
            "4",
        ]);
        assert!(
            small.is_err(),
            "S3 refuses parts below 5 MiB: so do we, up front"
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
                action:
                    BackupAction::Create {
                        client, to, name, ..
                    },
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
