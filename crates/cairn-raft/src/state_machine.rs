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

use cairn_core::command::{Append, Applied, Command, Outcome, PlannedAppends};
use cairn_store::{Store, StoreError, pack_dir, sync_dir, unpack_into};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncSeekExt;

use crate::codec::{decode, encode};
use crate::heads::HeadWatch;
use crate::{RaftObserver, StorageError, TypeConfig};

/// Directory (under the snapshot dir) of the current snapshot's checkpoint.
const CURRENT: &str = "current";
/// Metadata file inside a snapshot checkpoint directory.
const META_FILE: &str = "cairn-snapshot-meta.json";
/// A snapshot being replaced, until its successor is in place.
const RETIRED_PREFIX: &str = "retired-";

/// What the store records as "applied" with every write, atomically with its effects.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct AppliedMarker {
    /// Last entry whose every effect is stored.
    pub(crate) last_applied: Option<LogId<u64>>,
    /// Membership as of `last_applied`.
    membership: StoredMembership<u64, BasicNode>,
    /// A batch entry partly applied: its id and how many of its commands are stored. Each
    /// command of a batch is written separately (later ones must see earlier ones), so a
    /// crash can fall between two of them; re-applying the entry then skips those done.
    #[serde(default)]
    pub(crate) in_progress: Option<(LogId<u64>, usize)>,
    /// The name of the state (see [`state_token`]); `None` in markers written before
    /// states were named.
    state: Option<u128>,
}

/// The marker as written before states were named (postcard has no optional trailing
/// fields, so such a marker decodes as this and converts).
#[derive(Deserialize)]
struct AppliedMarkerV1 {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    in_progress: Option<(LogId<u64>, usize)>,
}

/// Decodes a stored applied marker, of this version or the one before.
fn decode_marker(bytes: &[u8]) -> Result<AppliedMarker, crate::codec::CodecError> {
    decode::<AppliedMarker>(bytes).or_else(|e| match decode::<AppliedMarkerV1>(bytes) {
        Ok(v1) => Ok(AppliedMarker {
            last_applied: v1.last_applied,
            membership: v1.membership,
            in_progress: v1.in_progress,
            state: None,
        }),
        Err(_) => Err(e),
    })
}

/// Top bit of the names of states reached by applying an entry without a plan.
const UNPLANNED_STATE: u128 = 1 << 127;

/// Names the state reached by applying entry `log_id` (or the empty state) other than by a
/// held plan: unique, because a log id names one entry for good (Raft's log matching).
fn unplanned_state(log_id: Option<LogId<u64>>) -> u128 {
    log_id.map_or(UNPLANNED_STATE, |id| {
        UNPLANNED_STATE | (u128::from(id.leader_id.term) << 64) | u128::from(id.index)
    })
}

impl AppliedMarker {
    /// The name of the state this marker's writes reached. Pre-execution (see
    /// [`Command::Planned`]) writes a plan's rows only on the state the plan was made on,
    /// so every replica must give every state the same name, and a name must never be
    /// given to two different states. Hence: a held plan names the state it reaches with
    /// the plan's own token (random, unique); every other entry (unplanned commands,
    /// stale plans, blank and membership entries) names it after its log id. Both depend
    /// on the log alone, so replicas agree, and so does a marker written before names
    /// existed: no plan had ever held then.
    pub(crate) fn state_token(&self) -> u128 {
        self.state
            .unwrap_or_else(|| unplanned_state(self.last_applied))
    }

    /// Records that entry `log_id` was applied whole, reaching the state named `state`.
    pub(crate) fn applied(&mut self, log_id: LogId<u64>, state: u128) {
        self.last_applied = Some(log_id);
        self.in_progress = None;
        self.state = Some(state);
    }

    /// Records that entry `log_id` was applied other than by a held plan.
    pub(crate) fn applied_unplanned(&mut self, log_id: LogId<u64>) {
        self.applied(log_id, unplanned_state(Some(log_id)));
    }
}

/// The name of the state `store` has applied (see [`AppliedMarker::state_token`]).
pub(crate) fn applied_state_token(store: &Store) -> Result<u128, StoreError> {
    marker_of(store).map(|m| m.state_token())
}

/// The applied marker `store` holds (the empty state's when it holds none).
pub(crate) fn marker_of(store: &Store) -> Result<AppliedMarker, StoreError> {
    store.applied_marker().map_or_else(
        || Ok(AppliedMarker::default()),
        |bytes| stored_marker(&bytes),
    )
}

/// Decodes a marker as the store holds it.
fn stored_marker(bytes: &[u8]) -> Result<AppliedMarker, StoreError> {
    decode_marker(bytes).map_err(|e| StoreError::Corrupt {
        cf: "sm_meta",
        detail: format!("applied marker: {e}"),
    })
}

/// Applies `entries` whole as the state machine does, outside openraft (a replay of
/// archived entries), moving `marker` on.
pub(crate) fn apply_entries_whole(
    store: &Store,
    entries: Vec<Entry<TypeConfig>>,
    marker: &mut AppliedMarker,
) -> Result<(), crate::archive::ArchiveError> {
    let index = entries.first().map_or(0, |e| e.log_id.index);
    let (_, moved, _) = applied_entries(store, entries, marker.clone(), &crate::NoObserver)
        .map_err(|e| crate::archive::ArchiveError::Apply {
            index,
            detail: e.to_string(),
        })?;
    *marker = moved;
    Ok(())
}

/// How far the log had been applied in a state machine whose applied marker is `marker`
/// (a backup's checkpoint): the last entry applied whole, and a batch entry partly applied
/// after it.
pub fn applied_position(
    marker: Option<&[u8]>,
) -> Result<cairn_store::backup::AppliedPosition, StoreError> {
    let marker = marker.map_or_else(|| Ok(AppliedMarker::default()), stored_marker)?;
    Ok(cairn_store::backup::AppliedPosition {
        index: marker.last_applied.map_or(0, |id| id.index),
        term: marker.last_applied.map_or(0, |id| id.leader_id.term),
        partial_entry: marker.in_progress.map(|(id, done)| (id.index, done as u64)),
    })
}

/// What a stale plan's commands get: not applied, to be proposed again. Only the proposer
/// that made the plan sees it (it re-proposes the commands without a plan).
pub(crate) const STALE_PLAN: &str = "the leader planned this write on a state that changed before it was applied; nothing was written";

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
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes).map_err(|e| snap_err(&e))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(snap_err(&e)),
        }
    }

    /// Makes `staged` (a complete, synced checkpoint with its meta file) the current
    /// snapshot. Power-safe: the old one is renamed aside, not removed, until the new one
    /// is in place and the directory synced; a cut between the two renames leaves the old
    /// one under a `retired-` name, which [`SnapshotDir::recover`] puts back.
    fn promote(&self, staged: &Path) -> Result<(), StorageError> {
        let current = self.current();
        let retired = self.path.join(format!("{RETIRED_PREFIX}{}", unix_nanos()));
        let had_current = current.exists();
        if had_current {
            std::fs::rename(&current, &retired).map_err(|e| snap_err(&e))?;
        }
        std::fs::rename(staged, &current).map_err(|e| snap_err(&e))?;
        sync_dir(&self.path).map_err(|e| snap_err(&e))?;
        if had_current && let Err(e) = std::fs::remove_dir_all(&retired) {
            tracing::warn!(
                "failed to remove the replaced snapshot {}: {e}",
                retired.display()
            );
        }
        self.remove_matching(|name| name.ends_with(".pack"));
        Ok(())
    }

    /// After a crash: a promotion cut short between its renames left no current snapshot
    /// but the old one retired; put it back. A current snapshot whose meta cannot be read
    /// (written by a version that did not sync it, then a power cut) is no snapshot: it is
    /// removed, and the next one is built from the state machine, which holds the data.
    fn recover(&self) -> Result<(), StoreError> {
        let io = |context: String| move |e| StoreError::Io { context, source: e };
        let current = self.current();
        if current.exists()
            && let Err(e) = SnapshotDir::read_meta(&current)
        {
            tracing::warn!(
                "removing the current snapshot {}: its meta is unreadable ({e})",
                current.display()
            );
            std::fs::remove_dir_all(&current)
                .map_err(io(format!("failed to remove {}", current.display())))?;
        }
        if current.exists() {
            return Ok(());
        }
        let entries = std::fs::read_dir(&self.path)
            .map_err(io(format!("failed to list {}", self.path.display())))?;
        let newest_retired = entries
            .flatten()
            .map(|e| e.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(RETIRED_PREFIX))
                    && matches!(SnapshotDir::read_meta(path), Ok(Some(_)))
            })
            .max();
        if let Some(retired) = newest_retired {
            tracing::warn!(
                "restoring snapshot {} that an interrupted replacement left aside",
                retired.display()
            );
            std::fs::rename(&retired, &current)
                .map_err(io(format!("failed to restore {}", retired.display())))?;
            sync_dir(&self.path)?;
        }
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

/// Free disk an install needs beyond the unpacked snapshot: RocksDB's WAL and memtable
/// flushes while the state is rewritten.
pub const INSTALL_HEADROOM_BYTES: u64 = 64 << 20;

/// Unpacks a received snapshot into `staged` with its meta file, all synced, so that a
/// restart that finds the install marker naming it finds it complete.
fn stage(received: &mut std::fs::File, staged: &Path, meta: &[u8]) -> Result<(), StoreError> {
    unpack_into(received, staged, INSTALL_HEADROOM_BYTES)?;
    write_meta(staged, meta)
}

/// Writes a checkpoint's meta file, synced with its directory: a snapshot whose meta is
/// there after a power cut is complete.
fn write_meta(checkpoint: &Path, meta: &[u8]) -> Result<(), StoreError> {
    let path = checkpoint.join(META_FILE);
    let io = |e| StoreError::Io {
        context: format!("failed to write {}", path.display()),
        source: e,
    };
    let mut file = std::fs::File::create(&path).map_err(io)?;
    std::io::Write::write_all(&mut file, meta).map_err(io)?;
    file.sync_all().map_err(io)?;
    sync_dir(checkpoint)
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
        let snapshots = SnapshotDir {
            path: snapshot_dir,
            lock: Arc::new(Mutex::new(())),
        };
        snapshots.recover()?;
        // A snapshot install the process did not live to finish left the state machine half
        // replaced: finish it from the same checkpoint before anything reads the state.
        if let Some(dir) = store.resume_install()? {
            tracing::warn!(
                "finished installing snapshot {} that a restart interrupted",
                dir.display()
            );
            if dir.join(META_FILE).exists() {
                snapshots
                    .promote(&dir)
                    .map_err(|e| StoreError::Task(e.to_string()))?;
            }
        }
        let marker = marker_of(&store)?;
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

fn apply_err(log_id: LogId<u64>, e: &StoreError) -> StorageError {
    tracing::error!("failed to apply entry {}: {e}", log_id.index);
    StorageIOError::apply(log_id, e).into()
}

/// Applies the commands of batch entry `log_id` in order: each run of consecutive appends
/// as one atomic RocksDB batch, any other command on its own. Each write carries the marker
/// of how far the entry got; re-applying the entry after a crash skips what is stored (see
/// [`AppliedMarker::in_progress`]).
fn apply_batch(
    store: &Store,
    log_id: LogId<u64>,
    commands: &[Command],
    marker: &mut AppliedMarker,
    touched: &mut BTreeSet<String>,
) -> Result<Outcome, StorageError> {
    let done = match marker.in_progress {
        Some((id, n)) if id == log_id => n.min(commands.len()),
        _ => 0,
    };
    let mut outcomes: Vec<Outcome> = (0..done)
        .map(|_| {
            Err(cairn_core::Error::Unavailable(
                "applied before a restart; its outcome was not kept".into(),
            ))
        })
        .collect();
    let mut start = done;
    while start < commands.len() {
        let end = match &commands[start] {
            Command::Append(_) => {
                start
                    + commands[start..]
                        .iter()
                        .take_while(|c| matches!(c, Command::Append(_)))
                        .count()
            }
            _ => start + 1,
        };
        let last = end == commands.len();
        let step = AppliedMarker {
            last_applied: if last {
                Some(log_id)
            } else {
                marker.last_applied
            },
            membership: marker.membership.clone(),
            in_progress: if last { None } else { Some((log_id, end)) },
            // Partly applied or not, the state is named after the entry changing it.
            state: Some(unplanned_state(Some(log_id))),
        };
        let bytes = encode(&step).map_err(|e| sm_write_err(&e))?;
        if matches!(commands[start], Command::Append(_)) {
            let run: Vec<&Append> = commands[start..end]
                .iter()
                .filter_map(|c| match c {
                    Command::Append(a) => Some(a),
                    _ => None,
                })
                .collect();
            let results = store
                .apply_appends(&run, &bytes)
                .map_err(|e| apply_err(log_id, &e))?;
            for (append, outcome) in run.iter().zip(&results) {
                if outcome.is_ok() {
                    touched.insert(append.boundary.clone());
                }
            }
            outcomes.extend(results);
        } else {
            let outcome = store
                .apply(&commands[start], &bytes)
                .map_err(|e| apply_err(log_id, &e))?;
            outcomes.push(outcome);
        }
        *marker = step;
        start = end;
    }
    if commands.is_empty() || done >= commands.len() {
        marker.applied_unplanned(log_id);
        let bytes = encode(&*marker).map_err(|e| sm_write_err(&e))?;
        store
            .apply_marker(&bytes)
            .map_err(|e| apply_err(log_id, &e))?;
    }
    Ok(Ok(Applied::Batch(outcomes)))
}

/// Writes a plan's rows if the state is the one it was made on; otherwise writes nothing
/// but the marker, and the commands' proposer proposes them again (see [`STALE_PLAN`]).
/// Every replica has the same state name here, so every replica decides alike.
fn apply_planned(
    store: &Store,
    log_id: LogId<u64>,
    plan: &PlannedAppends,
    marker: &mut AppliedMarker,
    touched: &mut BTreeSet<String>,
    observer: &dyn RaftObserver,
) -> Result<Outcome, StorageError> {
    let held = marker.state_token() == plan.base;
    observer.plan_applied(held);
    if held {
        marker.applied(log_id, plan.token);
        let bytes = encode(&*marker).map_err(|e| sm_write_err(&e))?;
        let boundaries = store
            .apply_rows(&plan.heads, &plan.rows.0, &bytes)
            .map_err(|e| apply_err(log_id, &e))?;
        touched.extend(boundaries);
        Ok(Ok(Applied::Done))
    } else {
        marker.applied_unplanned(log_id);
        let bytes = encode(&*marker).map_err(|e| sm_write_err(&e))?;
        store
            .apply_marker(&bytes)
            .map_err(|e| apply_err(log_id, &e))?;
        Ok(Err(cairn_core::Error::Unavailable(STALE_PLAN.to_string())))
    }
}

fn applied_entries(
    store: &Store,
    entries: Vec<Entry<TypeConfig>>,
    mut marker: AppliedMarker,
    observer: &dyn RaftObserver,
) -> Result<(Vec<Outcome>, AppliedMarker, BTreeSet<String>), StorageError> {
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut touched = BTreeSet::new();
    for entry in entries {
        let log_id = entry.log_id;
        let outcome = match &entry.payload {
            EntryPayload::Normal(proposal) => match proposal.command() {
                Command::Batch(commands) => {
                    apply_batch(store, log_id, commands, &mut marker, &mut touched)?
                }
                Command::Planned(plan) => {
                    apply_planned(store, log_id, plan, &mut marker, &mut touched, observer)?
                }
                command => {
                    marker.applied_unplanned(log_id);
                    let bytes = encode(&marker).map_err(|e| sm_write_err(&e))?;
                    let outcome = store
                        .apply(command, &bytes)
                        .map_err(|e| apply_err(log_id, &e))?;
                    if let (Command::Append(append), Ok(Applied::Appended { .. })) =
                        (command, &outcome)
                    {
                        touched.insert(append.boundary.clone());
                    }
                    outcome
                }
            },
            EntryPayload::Blank | EntryPayload::Membership(_) => {
                marker.applied_unplanned(log_id);
                if let EntryPayload::Membership(m) = &entry.payload {
                    marker.membership = StoredMembership::new(Some(log_id), m.clone());
                }
                let bytes = encode(&marker).map_err(|e| sm_write_err(&e))?;
                store
                    .apply_marker(&bytes)
                    .map_err(|e| apply_err(log_id, &e))?;
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
        let observer = self.observer.clone();
        let (outcomes, marker, touched) = tokio::task::spawn_blocking(move || {
            applied_entries(&store, entries, marker, observer.as_ref())
        })
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
        // The peer port refuses such ids before they get here; a second check costs nothing.
        if !valid_snapshot_id(&meta.snapshot_id) {
            return Err(snap_err(AnyError::error(format!(
                "refusing snapshot {:?}: not a snapshot id",
                meta.snapshot_id
            ))));
        }
        // Unpacked straight from the received file (no copy of it): with the file itself
        // removed before the live state is rewritten, an install needs the new state's
        // size in free disk once, not four times.
        snapshot
            .seek(SeekFrom::Start(0))
            .await
            .map_err(|e| snap_err(&e))?;
        let mut received = snapshot.into_std().await;
        let meta_bytes = serde_json::to_vec_pretty(meta).map_err(|e| snap_err(&e))?;
        let store = self.store.clone();
        let snapshots = self.snapshots.clone();
        let snapshot_id = meta.snapshot_id.clone();
        tokio::task::spawn_blocking(move || -> Result<(), StorageError> {
            let _guard = snapshots.guard();
            let staged = snapshots.path.join(format!("installing-{}", unix_nanos()));
            if let Err(e) = stage(&mut received, &staged, &meta_bytes) {
                // A leader that keeps sending a bad snapshot must not fill the disk with
                // half-unpacked copies until the next restart clears them.
                tracing::error!("failed to unpack snapshot {snapshot_id} from the leader: {e}");
                if let Err(clean) = std::fs::remove_dir_all(&staged) {
                    tracing::warn!("failed to remove {}: {clean}", staged.display());
                }
                snapshots.remove_matching(|name| name.starts_with("incoming-"));
                return Err(snap_err(&e));
            }
            drop(received);
            snapshots.remove_matching(|name| name.starts_with("incoming-"));
            // The checkpoint carries its own applied marker (including a batch in progress),
            // consistent with its data; installing it installs the marker too.
            store.install_checkpoint(&staged).map_err(|e| {
                tracing::error!("failed to install snapshot {snapshot_id}: {e}");
                snap_err(&e)
            })?;
            snapshots.promote(&staged)?;
            Ok(())
        })
        .await
        .map_err(|e| snap_err(AnyError::error(format!("install task failed: {e}"))))??;
        let marker: AppliedMarker = match self.store.applied_marker() {
            Some(bytes) => decode_marker(&bytes).map_err(|e| snap_err(&e))?,
            None => AppliedMarker::default(),
        };
        if marker.last_applied != meta.last_log_id {
            return Err(snap_err(AnyError::error(format!(
                "snapshot {} claims to end at {:?} but its state ends at {:?}",
                meta.snapshot_id, meta.last_log_id, marker.last_applied
            ))));
        }
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
            if !valid_snapshot_id(&meta.snapshot_id) {
                return Err(sm_read_err(AnyError::error(format!(
                    "the current snapshot's id {:?} is not a snapshot id",
                    meta.snapshot_id
                ))));
            }
            let pack = snapshots.path.join(format!("{}.pack", meta.snapshot_id));
            if !pack.exists() {
                let tmp = snapshots
                    .path
                    .join(format!("{}.pack.tmp", meta.snapshot_id));
                pack_dir(&current, &tmp).map_err(|e| snap_err(&e))?;
                std::fs::rename(&tmp, &pack).map_err(|e| snap_err(&e))?;
            }
            // Opened under the lock: a snapshot built next removes stale packs, and an open
            // handle keeps reading what a removed path named (a storage error here stops Raft).
            let file = std::fs::File::open(&pack)
                .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, &e)))?;
            Ok::<_, StorageError>(Some((meta, file)))
        })
        .await
        .map_err(|e| sm_read_err(AnyError::error(format!("snapshot task failed: {e}"))))??;
        let Some((meta, file)) = packed else {
            return Ok(None);
        };
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

/// Longest snapshot id accepted from a peer.
pub const MAX_SNAPSHOT_ID_BYTES: usize = 64;

/// True for a snapshot id this node could have built (`<term>-<index>-<nanos>`,
/// `empty-<nanos>`): ASCII letters, digits and dashes, 1 to [`MAX_SNAPSHOT_ID_BYTES`].
/// A peer's id becomes part of a file name; anything else (`../x`) could name a path
/// outside the snapshot directory.
pub fn valid_snapshot_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SNAPSHOT_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
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
                Some(bytes) => decode_marker(&bytes).map_err(|e| snap_err(&e))?,
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
            let meta_bytes = serde_json::to_vec_pretty(&meta).map_err(|e| snap_err(&e))?;
            write_meta(&staged, &meta_bytes).map_err(|e| snap_err(&e))?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn snapshot_ids_from_peers_cannot_name_other_paths() {
        for ok in [
            "3-120-1733212345678901234",
            "empty-1733212345678901234",
            "a",
        ] {
            assert!(super::valid_snapshot_id(ok), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "..",
            "a/b",
            "a\\b",
            "/etc/passwd",
            "x.pack",
            "ä",
            "a b",
            &"1".repeat(super::MAX_SNAPSHOT_ID_BYTES + 1),
        ] {
            assert!(!super::valid_snapshot_id(bad), "{bad:?}");
        }
    }

    use super::*;
    use cairn_core::event::{NewEvent, RawEvent};
    use cairn_store::{Direction, ReadStart, StoreOptions};
    use openraft::CommittedLeaderId;

    fn append(boundary: &str, n: usize) -> Command {
        Command::Append(Append {
            boundary: boundary.into(),
            observations: vec![],
            events: (0..n)
                .map(|i| {
                    NewEvent::validate(
                        RawEvent {
                            event_id: format!("e{i}"),
                            event_type: "T".into(),
                            data: "{}".into(),
                            metadata: String::new(),
                        },
                        i,
                    )
                    .expect("valid")
                })
                .collect(),
            at_unix_nanos: 0,
        })
    }

    fn create(name: &str) -> Command {
        Command::CreateBoundary {
            name: name.into(),
            description: String::new(),
            placement: None,
            existed_before_catalog: false,
            idempotent_event_ids: false,
            if_absent: false,
        }
    }

    fn events(store: &Store, name: &str) -> Vec<String> {
        let bid = store
            .with_catalog(|c| c.boundaries.get(name).map(|b| b.id))
            .expect("boundary");
        store
            .read_events(
                bid,
                &Default::default(),
                ReadStart::Edge,
                Direction::Asc,
                cairn_store::PageLimit::events(100),
            )
            .expect("read")
            .into_iter()
            .map(|e| e.event_id)
            .collect()
    }

    #[test]
    fn a_batch_interrupted_by_a_crash_is_completed_without_repeating_anything() {
        let log_id = LogId::new(CommittedLeaderId::new(1, 1), 7);
        let batch = vec![append("a", 2), create("b"), append("b", 1), append("a", 1)];
        let entry = Entry::<TypeConfig> {
            log_id,
            payload: EntryPayload::Normal(Command::Batch(batch.clone()).into()),
        };

        let open = || {
            let dir = tempfile::tempdir().expect("dir");
            let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
            store
                .apply(&create("a"), b"")
                .expect("create a")
                .expect("created");
            (dir, store)
        };

        // Uninterrupted.
        let (_d1, whole) = open();
        let (outcomes, marker, _) = applied_entries(
            &whole,
            vec![entry.clone()],
            AppliedMarker::default(),
            &crate::NoObserver,
        )
        .expect("apply");
        assert_eq!(marker.last_applied, Some(log_id));
        assert_eq!(marker.in_progress, None);
        let Ok(Applied::Batch(results)) = &outcomes[0] else {
            panic!("batch outcome expected: {outcomes:?}");
        };
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");

        // Crashed after the first run (the first append) was stored: the marker says so.
        let (_d2, crashed) = open();
        let partial = AppliedMarker {
            last_applied: None,
            membership: Default::default(),
            in_progress: Some((log_id, 1)),
            state: None,
        };
        let Command::Append(first) = &batch[0] else {
            unreachable!()
        };
        crashed
            .apply_appends(&[first], &encode(&partial).expect("encode"))
            .expect("first run");
        let restarted: AppliedMarker =
            decode(&crashed.applied_marker().expect("marker")).expect("decode");
        assert_eq!(restarted.in_progress, Some((log_id, 1)));
        let (_, marker, _) = applied_entries(&crashed, vec![entry], restarted, &crate::NoObserver)
            .expect("re-apply");
        assert_eq!(marker.last_applied, Some(log_id));
        assert_eq!(
            events(&crashed, "a"),
            events(&whole, "a"),
            "nothing applied twice"
        );
        assert_eq!(events(&crashed, "b"), events(&whole, "b"));
        assert_eq!(events(&whole, "a"), vec!["e0", "e1", "e0"]);
    }

    /// A state machine (snapshots in `<dir>/snapshots`) whose store holds boundary "a".
    fn state_machine_with_boundary_a() -> (tempfile::TempDir, Store, StateMachine) {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path().join("db"), &StoreOptions::default()).expect("open");
        store
            .apply(
                &create("a"),
                &encode(&AppliedMarker::default()).expect("marker"),
            )
            .expect("create a")
            .expect("created");
        let sm = StateMachine::new(
            store.clone(),
            dir.path().join("snapshots"),
            HeadWatch::default(),
            Arc::new(crate::NoObserver),
        )
        .expect("state machine");
        (dir, store, sm)
    }

    #[tokio::test]
    async fn a_snapshot_that_does_not_unpack_changes_nothing_and_leaves_nothing_behind() {
        let (dir, store, mut sm) = state_machine_with_boundary_a();
        let snapshots = dir.path().join("snapshots");
        // A pack whose one file claims more bytes than follow.
        let mut bad = b"CAIRN-SNAPSHOT-1\n".to_vec();
        bad.extend(7u32.to_be_bytes());
        bad.extend(b"OPTIONS");
        bad.extend(1000u64.to_be_bytes());
        bad.extend(b"short");
        let sent = dir.path().join("sent.pack");
        std::fs::write(&sent, &bad).expect("write");
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(9, 1), 90)),
            last_membership: StoredMembership::default(),
            snapshot_id: "9-90-1".into(),
        };
        let file = tokio::fs::File::open(&sent).await.expect("open");
        sm.install_snapshot(&meta, Box::new(file))
            .await
            .expect_err("a truncated pack is refused");
        let left: Vec<String> = std::fs::read_dir(&snapshots)
            .expect("snapshots dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.iter()
                .all(|n| !n.starts_with("installing-") && !n.starts_with("incoming-")),
            "left behind: {left:?}"
        );
        assert!(store.with_catalog(|c| c.active_boundary("a").is_some()));
    }

    fn reopen(dir: &Path, store: &Store) -> StateMachine {
        StateMachine::new(
            store.clone(),
            dir.join("snapshots"),
            HeadWatch::default(),
            Arc::new(crate::NoObserver),
        )
        .expect("the state machine reopens")
    }

    #[tokio::test]
    async fn a_power_cut_between_the_renames_of_a_promotion_keeps_the_old_snapshot() {
        let (dir, store, mut sm) = state_machine_with_boundary_a();
        let built = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        drop(sm);
        // What the disk holds when the power fails after `current` was renamed aside and
        // before the new snapshot took its place.
        let snapshots = dir.path().join("snapshots");
        std::fs::rename(snapshots.join(CURRENT), snapshots.join("retired-1")).expect("rename");
        let mut sm = reopen(dir.path(), &store);
        let current = sm.get_current_snapshot().await.expect("read");
        assert_eq!(
            current.map(|s| s.meta.snapshot_id),
            Some(built.meta.snapshot_id)
        );
        assert!(!snapshots.join("retired-1").exists());
    }

    #[tokio::test]
    async fn a_snapshot_whose_meta_a_power_cut_emptied_is_dropped_and_built_again() {
        let (dir, store, mut sm) = state_machine_with_boundary_a();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        drop(sm);
        // An unsynced meta file after a power cut: there, and empty.
        let meta = dir.path().join("snapshots").join(CURRENT).join(META_FILE);
        std::fs::write(&meta, b"").expect("empty the meta");
        let mut sm = reopen(dir.path(), &store);
        assert!(sm.get_current_snapshot().await.expect("read").is_none());
        let rebuilt = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        let current = sm
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("a snapshot");
        assert_eq!(current.meta.snapshot_id, rebuilt.meta.snapshot_id);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_being_sent_survives_new_snapshots_being_built() {
        let (_dir, _store, mut sm) = state_machine_with_boundary_a();
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.expect("first snapshot");
        // Each build swaps the current snapshot and removes the packs of older ones while
        // the state-machine task packs and opens the current one for a follower; a storage
        // error on either side stops Raft on a live node, so neither may trip the other.
        let building = tokio::spawn(async move {
            for _ in 0..40 {
                builder.build_snapshot().await.expect("build");
            }
        });
        while !building.is_finished() {
            let snapshot = sm.get_current_snapshot().await.expect("current snapshot");
            assert!(snapshot.is_some());
        }
        building.await.expect("builder");
    }

    fn planned_entry(
        store: &Store,
        log_id: LogId<u64>,
        base: u128,
        token: u128,
    ) -> Entry<TypeConfig> {
        let command = append("a", 2);
        let Command::Append(a) = &command else {
            unreachable!()
        };
        let run = store
            .plan_appends(&[a], &[])
            .expect("plan")
            .expect("plannable");
        Entry {
            log_id,
            payload: EntryPayload::Normal(
                Command::Planned(PlannedAppends {
                    base,
                    token,
                    heads: run.heads,
                    rows: cairn_core::command::Bytes(run.rows),
                })
                .into(),
            ),
        }
    }

    #[test]
    fn a_plan_writes_its_rows_only_on_the_state_it_was_made_on() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
        let id = |index| LogId::new(CommittedLeaderId::new(2, 1), index);
        let created = Entry::<TypeConfig> {
            log_id: id(1),
            payload: EntryPayload::Normal(create("a").into()),
        };
        let (_, marker, _) = applied_entries(
            &store,
            vec![created],
            AppliedMarker::default(),
            &crate::NoObserver,
        )
        .expect("create");
        let base = applied_state_token(&store).expect("token");
        assert_eq!(base, marker.state_token());
        assert_eq!(base, unplanned_state(Some(id(1))), "named after the entry");

        // Planned on this state: held, its rows written, the state named by the plan.
        let held = planned_entry(&store, id(2), base, 77);
        let (outcomes, marker, touched) =
            applied_entries(&store, vec![held], marker, &crate::NoObserver).expect("apply");
        assert_eq!(outcomes, vec![Ok(Applied::Done)]);
        assert_eq!(events(&store, "a"), ["e0", "e1"]);
        assert_eq!(touched, BTreeSet::from(["a".to_string()]));
        assert_eq!(marker.state_token(), 77);
        assert_eq!(applied_state_token(&store).expect("token"), 77);

        // Planned on the state before: stale, nothing written but the marker.
        let stale = planned_entry(&store, id(3), base, 78);
        let (outcomes, marker, touched) =
            applied_entries(&store, vec![stale], marker, &crate::NoObserver).expect("apply");
        assert_eq!(
            outcomes,
            vec![Err(cairn_core::Error::Unavailable(STALE_PLAN.into()))]
        );
        assert_eq!(events(&store, "a"), ["e0", "e1"]);
        assert!(touched.is_empty());
        assert_eq!(marker.last_applied, Some(id(3)));
        assert_eq!(marker.state_token(), unplanned_state(Some(id(3))));

        // A blank entry (a new leader's) renames the state: plans made before it are stale.
        let before_blank = marker.state_token();
        let blank = Entry::<TypeConfig> {
            log_id: id(4),
            payload: EntryPayload::Blank,
        };
        let (_, marker, _) =
            applied_entries(&store, vec![blank], marker, &crate::NoObserver).expect("blank");
        assert_ne!(marker.state_token(), before_blank);
        let late = planned_entry(&store, id(5), before_blank, 79);
        let (outcomes, _, _) =
            applied_entries(&store, vec![late], marker, &crate::NoObserver).expect("apply");
        assert!(outcomes[0].is_err(), "{outcomes:?}");
        assert_eq!(events(&store, "a"), ["e0", "e1"]);
    }

    /// A replay to a position inside a planned entry keeps the writes planned before the
    /// cut, to any boundary, and none from the first write past the position on.
    #[test]
    fn a_replay_cuts_a_planned_entry_between_writes_and_never_inside_one() {
        use crate::archive::{ArchiveError, Target, replay};
        use cairn_core::Position;
        let id = |i| LogId::new(openraft::CommittedLeaderId::new(1, 1), i);
        let entry = |i, command: Command| Entry::<TypeConfig> {
            log_id: id(i),
            payload: EntryPayload::Normal(command.into()),
        };
        let fresh = || {
            let dir = tempfile::tempdir().expect("dir");
            let store = Store::open(dir.path().join("db"), &cairn_store::StoreOptions::default())
                .expect("open");
            let mut marker = marker_of(&store).expect("marker");
            apply_entries_whole(
                &store,
                vec![entry(1, create("a")), entry(2, create("b"))],
                &mut marker,
            )
            .expect("apply");
            (dir, store, marker)
        };
        let (_plan_dir, planning, marker) = fresh();
        // Planned together: a 0..=1 (2:1), b 0 (1:0), a 2..=4 (5:4), a 5 (6:5).
        let commands = [
            append("a", 2),
            append("b", 1),
            append("a", 3),
            append("a", 1),
        ];
        let appends: Vec<&Append> = commands
            .iter()
            .map(|c| match c {
                Command::Append(a) => a,
                _ => unreachable!(),
            })
            .collect();
        let run = planning
            .plan_appends(&appends, &[])
            .expect("plan")
            .expect("plannable");
        let planned = entry(
            3,
            Command::Planned(PlannedAppends {
                base: marker.state_token(),
                token: 77,
                heads: run.heads,
                rows: cairn_core::command::Bytes(run.rows),
            }),
        );
        let bytes = crate::codec::encode_entry(&planned).expect("encode");
        let heads = |store: &Store| {
            store.with_catalog(|c| {
                let head = |n: &str| c.active_boundary(n).map(|b| c.head(b.id));
                (head("a"), head("b"))
            })
        };
        let target = |commit, prepare| Target {
            boundary: "a".into(),
            position: Position::new(commit, prepare),
        };
        for ((commit, prepare), expected) in [
            ((2, 1), (Some(2), Some(1))),
            ((5, 4), (Some(5), Some(1))),
            ((6, 5), (Some(6), Some(1))),
        ] {
            let (_dir, store, _) = fresh();
            let replayed = replay(
                &store,
                vec![Ok((3, bytes.clone()))],
                Some(&target(commit, prepare)),
            )
            .expect("replay");
            assert_eq!(replayed.last_event, Some(Position::new(commit, prepare)));
            assert_eq!(heads(&store), expected, "cut at {commit}:{prepare}");
            let events = events(&store, "a");
            assert_eq!(
                events.len() as i64,
                commit,
                "a's events up to {commit}:{prepare}"
            );
        }
        let (_dir, store, _) = fresh();
        let split = replay(&store, vec![Ok((3, bytes.clone()))], Some(&target(5, 3)));
        assert!(
            matches!(split, Err(ArchiveError::SplitsWrite { .. })),
            "{split:?}"
        );
        let (_dir, store, _) = fresh();
        let beyond = replay(&store, vec![Ok((3, bytes))], Some(&target(9, 8)));
        assert!(
            matches!(beyond, Err(ArchiveError::NotArchived { .. })),
            "{beyond:?}"
        );
    }

    #[test]
    fn a_marker_written_before_states_were_named_still_decodes() {
        #[derive(Serialize)]
        struct V1 {
            last_applied: Option<LogId<u64>>,
            membership: StoredMembership<u64, BasicNode>,
            in_progress: Option<(LogId<u64>, usize)>,
        }
        let log_id = LogId::new(CommittedLeaderId::new(4, 1), 9);
        let bytes = encode(&V1 {
            last_applied: Some(log_id),
            membership: StoredMembership::default(),
            in_progress: None,
        })
        .expect("encode");
        let marker = decode_marker(&bytes).expect("decode");
        assert_eq!(marker.last_applied, Some(log_id));
        assert_eq!(marker.state, None);
        // Named as the entry that reached it: what a replica replaying the log names it.
        assert_eq!(marker.state_token(), unplanned_state(Some(log_id)));
        let current = encode(&marker).expect("encode");
        assert_eq!(
            decode_marker(&current).expect("decode").last_applied,
            Some(log_id)
        );
        assert!(decode_marker(&[1, 0xff]).is_err());
    }
}
