//! openraft's state-machine seam over `cairn-store`.
//!
//! `apply` hands each committed entry to [`cairn_store::Store::apply`] together with the
//! applied marker (last applied log id + membership), so RocksDB holds both in one batch.
//! Snapshots are RocksDB checkpoints: building one is a memtable flush plus hard links, so it
//! is cheap enough to run often; the single-file packed form needed to ship a snapshot to
//! another node is produced only when openraft asks for the current snapshot.

use std::collections::BTreeSet;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::command::{Applied, Command, Outcome};
use cairn_store::{Store, StoreError, pack_dir, unpack_dir};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncSeekExt;

use crate::codec::{decode, encode};
use crate::node::HeadWatch;
use crate::{RaftObserver, StorageError, TypeConfig};

/// Directory (under the snapshot dir) of the current snapshot's checkpoint.
const CURRENT: &str = "current";
/// Metadata file inside a snapshot checkpoint directory.
const META_FILE: &str = "cairn-snapshot-meta.json";

/// What the store records as "applied" with every batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AppliedMarker {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
}

fn sm_write_err(e: impl Into<AnyError>) -> StorageError {
    StorageIOError::write_state_machine(e).into()
}

fn sm_read_err(e: impl Into<AnyError>) -> StorageError {
    StorageIOError::read_state_machine(e).into()
}

fn snap_err(e: impl Into<AnyError>) -> StorageError {
    StorageIOError::write_snapshot(None, e).into()
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Shared snapshot-directory state: the builder runs in its own task, concurrently with
/// the state-machine worker that serves and installs snapshots.
#[derive(Clone)]
struct SnapshotDir {
    path: PathBuf,
    lock: Arc<Mutex<()>>,
}

impl SnapshotDir {
    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current(&self) -> PathBuf {
        self.path.join(CURRENT)
    }

    fn read_meta(dir: &Path) -> Result<Option<SnapshotMeta<u64, BasicNode>>, StorageError> {
        match std::fs::read(dir.join(META_FILE)) {
            Ok(bytes) => Ok(Some(decode(&bytes).map_err(|e| snap_err(&e))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(snap_err(&e)),
        }
    }

    /// Makes `staged` (a complete checkpoint with its meta file) the current snapshot.
    fn promote(&self, staged: &Path) -> Result<(), StorageError> {
        let current = self.current();
        if current.exists() {
            std::fs::remove_dir_all(&current).map_err(|e| snap_err(&e))?;
        }
        std::fs::rename(staged, &current).map_err(|e| snap_err(&e))?;
        self.remove_matching(|name| name.ends_with(".pack"));
        Ok(())
    }

    /// Removes leftovers of interrupted builds/installs and stale packs.
    fn remove_matching(&self, pred: impl Fn(&str) -> bool) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != CURRENT && pred(&name) {
                let path = entry.path();
                let result = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = result {
                    tracing::warn!(
                        "failed to remove stale snapshot file {}: {e}",
                        path.display()
                    );
                }
            }
        }
    }
}

/// The state machine openraft drives.
pub struct StateMachine {
    store: Store,
    snapshots: SnapshotDir,
    heads: HeadWatch,
    marker: AppliedMarker,
    observer: Arc<dyn RaftObserver>,
}

impl StateMachine {
    /// Wraps the store; `snapshot_dir` holds checkpoints (created if missing).
    pub fn new(
        store: Store,
        snapshot_dir: PathBuf,
        heads: HeadWatch,
        observer: Arc<dyn RaftObserver>,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(&snapshot_dir).map_err(|e| StoreError::Io {
            context: format!("failed to create {}", snapshot_dir.display()),
            source: e,
        })?;
        let marker = match store.applied_marker() {
            Some(bytes) => decode(&bytes).map_err(|e| StoreError::Corrupt {
                cf: "sm_meta",
                detail: format!("applied marker: {e}"),
            })?,
            None => AppliedMarker::default(),
        };
        let snapshots = SnapshotDir {
            path: snapshot_dir,
            lock: Arc::new(Mutex::new(())),
        };
        // Anything but the current snapshot is debris from an interrupted build or install.
        snapshots.remove_matching(|_| true);
        Ok(StateMachine {
            store,
            snapshots,
            heads,
            marker,
            observer,
        })
    }
}

fn applied_entries(
    store: &Store,
    entries: Vec<Entry<TypeConfig>>,
    mut marker: AppliedMarker,
) -> Result<(Vec<Outcome>, AppliedMarker, BTreeSet<String>), StorageError> {
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut touched = BTreeSet::new();
    for entry in entries {
        let log_id = entry.log_id;
        marker.last_applied = Some(log_id);
        if let EntryPayload::Membership(m) = &entry.payload {
            marker.membership = StoredMembership::new(Some(log_id), m.clone());
        }
        let bytes = encode(&marker).map_err(|e| sm_write_err(&e))?;
        let outcome = match &entry.payload {
            EntryPayload::Normal(command) => {
                let outcome = store.apply(command, &bytes).map_err(|e| {
                    tracing::error!("failed to apply entry {}: {e}", log_id.index);
                    StorageError::from(StorageIOError::apply(log_id, &e))
                })?;
                if let (Command::Append(append), Ok(Applied::Appended { .. })) = (command, &outcome)
                {
                    touched.insert(append.boundary.clone());
                }
                outcome
            }
            EntryPayload::Blank | EntryPayload::Membership(_) => {
                store.apply_marker(&bytes).map_err(|e| {
                    tracing::error!("failed to apply entry {}: {e}", log_id.index);
                    StorageError::from(StorageIOError::apply(log_id, &e))
                })?;
                Ok(Applied::Done)
            }
        };
        outcomes.push(outcome);
    }
    Ok((outcomes, marker, touched))
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError> {
        Ok((self.marker.last_applied, self.marker.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let count = entries.len();
        let started = std::time::Instant::now();
        let store = self.store.clone();
        let marker = self.marker.clone();
        let (outcomes, marker, touched) =
            tokio::task::spawn_blocking(move || applied_entries(&store, entries, marker))
                .await
                .map_err(|e| sm_write_err(AnyError::error(format!("apply task failed: {e}"))))??;
        self.marker = marker;
        self.observer.applied(count, started.elapsed());
        for boundary in touched {
            self.heads.publish(&self.store, &boundary);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            snapshots: self.snapshots.clone(),
            observer: self.observer.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self
            .snapshots
            .path
            .join(format!("incoming-{}.pack", unix_nanos()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| snap_err(&e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        // Copy the received bytes to a path we own: the handle may belong to another
        // directory (or another node's store in tests).
        let received = self
            .snapshots
            .path
            .join(format!("received-{}.pack", unix_nanos()));
        snapshot
            .seek(SeekFrom::Start(0))
            .await
            .map_err(|e| snap_err(&e))?;
        let mut out = tokio::fs::File::create(&received)
            .await
            .map_err(|e| snap_err(&e))?;
        tokio::io::copy(&mut snapshot, &mut out)
            .await
            .map_err(|e| snap_err(&e))?;
        out.sync_all().await.map_err(|e| snap_err(&e))?;
        drop(out);

        let marker = AppliedMarker {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let marker_bytes = encode(&marker).map_err(|e| snap_err(&e))?;
        let meta_bytes = encode(meta).map_err(|e| snap_err(&e))?;
        let store = self.store.clone();
        let snapshots = self.snapshots.clone();
        tokio::task::spawn_blocking(move || -> Result<(), StorageError> {
            let _guard = snapshots.guard();
            let staged = snapshots.path.join(format!("installing-{}", unix_nanos()));
            unpack_dir(&received, &staged).map_err(|e| snap_err(&e))?;
            store.install_checkpoint(&staged).map_err(|e| {
                tracing::error!("failed to install snapshot: {e}");
                snap_err(&e)
            })?;
            store
                .apply_marker(&marker_bytes)
                .map_err(|e| snap_err(&e))?;
            std::fs::write(staged.join(META_FILE), &meta_bytes).map_err(|e| snap_err(&e))?;
            snapshots.promote(&staged)?;
            snapshots.remove_matching(|name| {
                name.starts_with("received-") || name.starts_with("incoming-")
            });
            Ok(())
        })
        .await
        .map_err(|e| snap_err(AnyError::error(format!("install task failed: {e}"))))??;
        self.marker = marker;
        self.observer.snapshot_installed();
        self.heads.publish_all(&self.store);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let snapshots = self.snapshots.clone();
        let packed = tokio::task::spawn_blocking(move || {
            let _guard = snapshots.guard();
            let current = snapshots.current();
            let Some(meta) = SnapshotDir::read_meta(&current)? else {
                return Ok(None);
            };
            let pack = snapshots.path.join(format!("{}.pack", meta.snapshot_id));
            if !pack.exists() {
                let tmp = snapshots
                    .path
                    .join(format!("{}.pack.tmp", meta.snapshot_id));
                pack_dir(&current, &tmp).map_err(|e| snap_err(&e))?;
                std::fs::rename(&tmp, &pack).map_err(|e| snap_err(&e))?;
            }
            Ok::<_, StorageError>(Some((meta, pack)))
        })
        .await
        .map_err(|e| sm_read_err(AnyError::error(format!("snapshot task failed: {e}"))))??;
        let Some((meta, pack)) = packed else {
            return Ok(None);
        };
        let file = tokio::fs::File::open(&pack)
            .await
            .map_err(|e| snap_err(&e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

/// Builds checkpoint snapshots in openraft's background task.
pub struct SnapshotBuilder {
    store: Store,
    snapshots: SnapshotDir,
    observer: Arc<dyn RaftObserver>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let store = self.store.clone();
        let snapshots = self.snapshots.clone();
        let (meta, manifest) = tokio::task::spawn_blocking(move || -> Result<_, StorageError> {
            let staged = snapshots.path.join(format!("building-{}", unix_nanos()));
            let marker_bytes = store.create_checkpoint(&staged).map_err(|e| {
                tracing::error!("failed to build snapshot: {e}");
                snap_err(&e)
            })?;
            let marker: AppliedMarker = match marker_bytes {
                Some(bytes) => decode(&bytes).map_err(|e| snap_err(&e))?,
                None => AppliedMarker::default(),
            };
            let snapshot_id = match marker.last_applied {
                Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, unix_nanos()),
                None => format!("empty-{}", unix_nanos()),
            };
            let meta = SnapshotMeta {
                last_log_id: marker.last_applied,
                last_membership: marker.membership,
                snapshot_id,
            };
            std::fs::write(
                staged.join(META_FILE),
                encode(&meta).map_err(|e| snap_err(&e))?,
            )
            .map_err(|e| snap_err(&e))?;
            let _guard = snapshots.guard();
            snapshots.promote(&staged)?;
            let manifest = std::fs::File::open(snapshots.current().join(META_FILE))
                .map_err(|e| snap_err(&e))?;
            Ok((meta, manifest))
        })
        .await
        .map_err(|e| snap_err(AnyError::error(format!("snapshot task failed: {e}"))))??;
        tracing::info!(snapshot_id = %meta.snapshot_id, "built snapshot");
        self.observer.snapshot_built();
        // openraft keeps only the metadata of a freshly built snapshot; the data handle is the
        // checkpoint's manifest. The transferable packed form is made by get_current_snapshot.
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(manifest)),
        })
    }
}
