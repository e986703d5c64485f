//! `cairn.v1.Backup`: an online backup of this node's state machine (client port, ADMIN).
//!
//! The node takes a RocksDB checkpoint (hard links: cheap, consistent at one applied log
//! index, with the writer lock held only while RocksDB links the files) into a staging
//! directory beside its data, and streams it file by file, hashing as it reads; the
//! manifest goes last. Applying and serving go on meanwhile. The staging directory is
//! removed when the stream ends however it ends, and at the next start if the process
//! died first. One backup runs at a time per node: a checkpoint pins the files it links,
//! and two would pin twice for nothing.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use cairn_core::Error;
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::backup_server::Backup;
use cairn_store::backup::{self as store_backup, BACKUP_FORMAT, DB_DIR, Manifest, ManifestFile};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::rpc::node_of;
use crate::state::{NodeState, Ready, unix_nanos};

/// File (in the data directory) of a restore whose node has not yet sealed its log: from
/// `cairn restore` until the first start has snapshotted the restored state and purged
/// the log behind it (see [`seal_restored`]).
pub const RESTORED_MARKER: &str = "restored";
/// How long the first start of a restored directory waits for its snapshot and purge.
const SEAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Directory (in the data directory) of the checkpoints being streamed.
pub const BACKUP_STAGING_DIR: &str = "backup-staging";
/// File (in the data directory) of the last backup this node streamed whole, so that
/// `cairn_backup_last_success_timestamp_seconds` survives a restart: an alert on backups
/// that stopped must not fire, or fall silent, because a node restarted.
pub const LAST_BACKUP_FILE: &str = "backup-last-success.json";

/// What [`LAST_BACKUP_FILE`] holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LastBackup {
    pub unix_seconds: i64,
    pub duration_seconds: f64,
    pub bytes: u64,
    pub applied_index: u64,
}

fn publish(metrics: &Metrics, last: &LastBackup) {
    metrics.backup_last_success.set(last.unix_seconds);
    metrics.backup_duration.set(last.duration_seconds);
    metrics
        .backup_bytes
        .set(i64::try_from(last.bytes).unwrap_or(i64::MAX));
}

/// Publishes the last backup a previous process recorded (none: the gauges stay 0).
pub fn load_last_success(data_dir: &Path, metrics: &Metrics) {
    let path = data_dir.join(LAST_BACKUP_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<LastBackup>(&bytes) {
            Ok(last) => publish(metrics, &last),
            Err(e) => tracing::warn!(
                "ignoring {}: {e}; cairn_backup_last_success_timestamp_seconds starts at 0 until the next backup",
                path.display()
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            "failed to read {}: {e}; cairn_backup_last_success_timestamp_seconds starts at 0 until the next backup",
            path.display()
        ),
    }
}

/// Publishes a backup streamed whole and records it for the next start (a failure to
/// record is logged: the backup itself is fine, only a restart would forget its time).
fn record_success(data_dir: &Path, metrics: &Metrics, last: &LastBackup) {
    metrics.backups.with_label_values(&["succeeded"]).inc();
    publish(metrics, last);
    let path = data_dir.join(LAST_BACKUP_FILE);
    let written = serde_json::to_vec(last)
        .map_err(|e| e.to_string())
        .and_then(|json| cairn_store::write_file_durably(&path, &json).map_err(|e| e.to_string()));
    if let Err(e) = written {
        tracing::warn!(
            "failed to record the backup in {}: {e}; after a restart cairn_backup_last_success_timestamp_seconds shows the one before",
            path.display()
        );
    }
}
/// Bytes of a file per stream message: well inside any message limit a node accepts.
pub const BACKUP_CHUNK_BYTES: usize = 256 * 1024;
/// Largest message of a backup stream, either end: a chunk, or the manifest, which names
/// every file (~150 bytes each: a terabyte in 64 MiB files is ~2.5 MB of manifest). Set
/// apart from the client port's response limit, which bounds reads, not this.
pub const MAX_BACKUP_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Messages read ahead of the client: a slow client holds back the reading, not memory.
const STREAM_BUFFER: usize = 8;

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// The Backup service.
#[derive(Clone)]
pub struct BackupService {
    ready: Ready,
    running: Arc<Semaphore>,
}

impl BackupService {
    /// A service answering UNAVAILABLE until `ready` is set.
    pub fn new(ready: Ready) -> Self {
        BackupService {
            ready,
            running: Arc::new(Semaphore::new(1)),
        }
    }
}

/// Removes what an earlier process left in the staging directory (it died mid-backup).
pub fn clear_staging(data_dir: &Path) -> std::io::Result<()> {
    let staging = data_dir.join(BACKUP_STAGING_DIR);
    match std::fs::remove_dir_all(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Refuses to start a restored directory as one of several initial members or as a
/// joiner: it must form a group of its own first (every other member then copies its
/// state by snapshot), see docs/backup.md.
pub fn check_restored_start(config: &crate::config::ServeConfig) -> Result<(), String> {
    use crate::config::Membership;
    match config.cluster.as_ref().map(|c| &c.membership) {
        None => Ok(()),
        Some(Membership::Initial(members)) if members.len() == 1 => Ok(()),
        Some(_) => Err(format!(
            "{} holds a restored backup: start it as a new group of its own (no --join, --initial-members naming only this node, or neither), then add members to it",
            config.data_dir.display()
        )),
    }
}

/// The first start of a restored directory: its new log must never be replayed to a
/// member that joins (the restored events are in the state machine, in no entry), so the
/// state is snapshotted and the log purged behind it before the node takes members; then
/// the marker goes.
pub async fn seal_restored(node: &NodeState) -> Result<(), String> {
    let marker = node.config.data_dir.join(RESTORED_MARKER);
    if !marker.exists() {
        return Ok(());
    }
    let index = node
        .raft
        .seal_log_behind_snapshot(SEAL_TIMEOUT)
        .await
        .map_err(|e| format!("failed to snapshot the restored state: {e}"))?;
    std::fs::remove_file(&marker)
        .and_then(|_| std::fs::File::open(&node.config.data_dir)?.sync_all())
        .map_err(|e| format!("failed to remove {}: {e}", marker.display()))?;
    tracing::info!(
        snapshot_index = index,
        cluster_id = node.identity.id().unwrap_or_default(),
        "serving a restored backup as a new cluster"
    );
    Ok(())
}

/// Membership changes wait until a restored node has sealed its log.
pub fn refuse_members_while_sealing(node: &NodeState) -> Result<(), Error> {
    if node.config.data_dir.join(RESTORED_MARKER).exists() {
        return Err(Error::Unavailable(
            "this node serves a restored backup and has not yet snapshotted it: no member can join until it has; retry".into(),
        ));
    }
    Ok(())
}

/// A checkpoint ready to stream.
struct Staged {
    dir: PathBuf,
    files: Vec<(String, u64)>,
    manifest: Manifest,
}

/// Removes the staging directory when the stream is done with it.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(
                "failed to remove the backup checkpoint {}: {e}",
                self.0.display()
            );
        }
    }
}

fn stage(node: &NodeState) -> Result<Staged, Error> {
    let dir = node
        .config
        .data_dir
        .join(BACKUP_STAGING_DIR)
        .join(uuid::Uuid::new_v4().simple().to_string());
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Error::internal(format!(
            "failed to {what} the backup checkpoint {}: {e}",
            dir.display()
        ))
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail("create", &e))?;
    let guard = RemoveOnDrop(dir.clone());
    let checkpoint = dir.join(DB_DIR);
    node.store()
        .create_checkpoint(&checkpoint)
        .map_err(|e| fail("take", &e))?;
    let contents =
        store_backup::checkpoint_contents(&checkpoint, false).map_err(|e| fail("read", &e))?;
    let applied = cairn_raft::applied_position(contents.applied_marker.as_deref())
        .map_err(|e| fail("read", &e))?;
    let mut files = Vec::new();
    for path in store_backup::list_files(&dir).map_err(|e| fail("list", &e))? {
        if store_backup::is_info_log(&path) {
            continue;
        }
        let size = std::fs::metadata(dir.join(&path))
            .map_err(|e| fail("stat", &e))?
            .len();
        files.push((path, size));
    }
    std::mem::forget(guard);
    Ok(Staged {
        dir,
        files,
        manifest: Manifest {
            format: BACKUP_FORMAT,
            cairn_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_seconds: unix_nanos().div_euclid(1_000_000_000),
            cluster_id: node.identity.id(),
            node_id: node.config.node_id,
            applied,
            store_format: cairn_store::STORE_FORMAT,
            boundaries: contents.boundaries,
            users: contents.users,
            indexes: contents.indexes,
            files: Vec::new(),
        },
    })
}

fn part(part: pb::backup_chunk::Part) -> pb::BackupChunk {
    pb::BackupChunk { part: Some(part) }
}

/// Why a stream ended before its manifest.
enum Cut {
    /// The client went away.
    ClientGone,
    /// Reading the checkpoint failed (the client was told).
    Failed(String),
}

/// Streams the staged checkpoint into `tx` (blocking reads: run on a blocking thread).
/// Returns the backup's size in bytes once the manifest is handed to the connection.
fn stream(staged: Staged, tx: &mpsc::Sender<Result<pb::BackupChunk, Status>>) -> Result<u64, Cut> {
    let _remove = RemoveOnDrop(staged.dir.clone());
    let send = |chunk: pb::BackupChunk| tx.blocking_send(Ok(chunk)).map_err(|_| Cut::ClientGone);
    let fail = |e: String| {
        let _ = tx.blocking_send(Err(cairn_proto::to_status(Error::internal(e.clone()))));
        Err(Cut::Failed(e))
    };
    let total: u64 = staged.files.iter().map(|(_, size)| size).sum();
    send(part(pb::backup_chunk::Part::Started(pb::BackupStarted {
        total_bytes: total,
        files: u32::try_from(staged.files.len()).unwrap_or(u32::MAX),
        applied_index: staged.manifest.applied.index,
    })))?;
    let mut manifest = staged.manifest;
    let mut buf = vec![0u8; BACKUP_CHUNK_BYTES];
    for (path, _) in &staged.files {
        let full = staged.dir.join(path);
        let mut file = match File::open(&full) {
            Ok(f) => f,
            Err(e) => return fail(format!("failed to open {}: {e}", full.display())),
        };
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return fail(format!("failed to read {}: {e}", full.display())),
            };
            hasher.update(&buf[..n]);
            size += n as u64;
            send(part(pb::backup_chunk::Part::Data(pb::FileData {
                path: path.clone(),
                data: buf[..n].to_vec(),
            })))?;
        }
        let sha256 = store_backup::hex(&hasher.finalize());
        send(part(pb::backup_chunk::Part::End(pb::FileEnd {
            path: path.clone(),
            size,
            sha256: sha256.clone(),
        })))?;
        manifest.files.push(ManifestFile {
            path: path.clone(),
            size,
            sha256,
        });
    }
    send(part(pb::backup_chunk::Part::ManifestJson(
        manifest.to_json(),
    )))?;
    Ok(total)
}

#[tonic::async_trait]
impl Backup for BackupService {
    type CreateStream = ChunkStream;

    async fn create(
        &self,
        _request: Request<pb::CreateBackupRequest>,
    ) -> Result<Response<Self::CreateStream>, Status> {
        let node = node_of(&self.ready)?;
        let permit = self.running.clone().try_acquire_owned().map_err(|_| {
            cairn_proto::to_status(Error::ResourceExhausted(
                "a backup of this node is already running: wait for it to finish, or back up another member".into(),
            ))
        })?;
        let staging_node = node.clone();
        let staged = tokio::task::spawn_blocking(move || stage(&staging_node))
            .await
            .map_err(|e| {
                cairn_proto::to_status(Error::internal(format!("backup task failed: {e}")))
            })?
            .map_err(|e| {
                tracing::error!("{e}");
                node.metrics.backups.with_label_values(&["failed"]).inc();
                cairn_proto::to_status(e)
            })?;
        tracing::info!(
            applied_index = staged.manifest.applied.index,
            files = staged.files.len(),
            "backup checkpoint taken; streaming it"
        );
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let started = std::time::Instant::now();
        let applied_index = staged.manifest.applied.index;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let metrics = &node.metrics;
            match stream(staged, &tx) {
                Ok(bytes) => {
                    let seconds = started.elapsed().as_secs_f64();
                    tracing::info!(bytes, applied_index, "backup streamed in {seconds:.1}s");
                    let last = LastBackup {
                        unix_seconds: unix_nanos().div_euclid(1_000_000_000),
                        duration_seconds: seconds,
                        bytes,
                        applied_index,
                    };
                    record_success(&node.config.data_dir, metrics, &last);
                }
                Err(Cut::ClientGone) => {
                    metrics.backups.with_label_values(&["client_gone"]).inc();
                    tracing::warn!("backup stream ended before the manifest: the client went away")
                }
                Err(Cut::Failed(e)) => {
                    metrics.backups.with_label_values(&["failed"]).inc();
                    tracing::error!("backup failed: {e}")
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
