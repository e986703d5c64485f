//! Backups: what a checkpoint of the state machine holds, the manifest that describes it,
//! checking a backup against its manifest, and turning one into a new data directory.
//!
//! A backup is a directory: `manifest.json` and `db/`, a RocksDB checkpoint of the state
//! machine's column families (the Raft log stays with each node, as for snapshots). The
//! manifest names every file with its size and SHA-256, and what the checkpoint holds
//! (each boundary's events and last position, users, indexes). It is written last: a
//! backup without one is incomplete. The layout and every field are in docs/backup.md.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use rocksdb::{DB, IteratorMode, Options};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::catalog::Catalog;
use crate::{CF_EVENTS, CF_SM_META, STATE_MACHINE_CFS, Store, StoreError, keys, sync_dir};

/// Format of [`Manifest`]: bump it when a field changes meaning or a reader of this version
/// would misread a backup.
pub const BACKUP_FORMAT: u32 = 1;
/// The manifest's file name in a backup.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The checkpoint's directory in a backup.
pub const DB_DIR: &str = "db";
/// Written beside the manifest by `cairn backup verify --record`: when the backup last
/// passed verification. Not part of what a backup holds (the manifest does not name it);
/// retention reads it, as only a verified backup lets older ones go.
pub const VERIFIED_FILE: &str = "verified.json";
/// Bytes read at a time while hashing or copying a file.
const CHUNK_BYTES: usize = 1024 * 1024;

/// One boundary as a backup holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryContents {
    /// Boundary name.
    pub name: String,
    /// Number of events (= the next prepare position).
    pub events: u64,
    /// Commit position of its last event (-1: none).
    pub last_commit: i64,
    /// Prepare position of its last event (-1: none).
    pub last_prepare: i64,
}

/// What a checkpoint of the state machine holds, read from the checkpoint itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointContents {
    /// Every boundary, by name.
    pub boundaries: Vec<BoundaryContents>,
    /// Number of users.
    pub users: u64,
    /// Number of indexes.
    pub indexes: u64,
    /// The Raft layer's applied marker as stored (decoded by cairn-raft).
    pub applied_marker: Option<Vec<u8>>,
}

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path relative to the backup's root, `/`-separated (`db/000012.sst`).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of its contents, lower-case hex.
    pub sha256: String,
}

/// How far the log had been applied when the checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPosition {
    /// Index of the last entry applied whole (0: none).
    pub index: u64,
    /// Its term (0: none).
    pub term: u64,
    /// A batch entry partly applied after it: its index and how many of its commands the
    /// checkpoint holds (each command is a whole client write).
    pub partial_entry: Option<(u64, u64)>,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`BACKUP_FORMAT`] of the writer.
    pub format: u32,
    /// Version of the Cairn that took it.
    pub cairn_version: String,
    /// When the checkpoint was taken, Unix seconds (the node's clock).
    pub created_unix_seconds: i64,
    /// Id of the cluster it was taken from, when that cluster has one.
    pub cluster_id: Option<String>,
    /// Raft id of the node it was taken on.
    pub node_id: u64,
    /// The log position the state machine had reached.
    pub applied: AppliedPosition,
    /// Storage format of the checkpoint ([`crate::STORE_FORMAT`] of the writer).
    pub store_format: u32,
    /// Every boundary, by name.
    pub boundaries: Vec<BoundaryContents>,
    /// Number of users.
    pub users: u64,
    /// Number of indexes.
    pub indexes: u64,
    /// Every file but the manifest, by path.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// Sum of the files' sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Number of events in all boundaries.
    pub fn total_events(&self) -> u64 {
        self.boundaries.iter().map(|b| b.events).sum()
    }

    /// The manifest as written to `manifest.json` (pretty, so a person can read it).
    pub fn to_json(&self) -> String {
        // Plain structs with string keys: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses a manifest, refusing a format this build does not know.
    pub fn from_json(text: &str, source: &str) -> Result<Manifest, BackupError> {
        #[derive(Deserialize)]
        struct FormatOnly {
            format: u32,
        }
        let format = serde_json::from_str::<FormatOnly>(text)
            .map_err(|e| BackupError::Manifest(format!("{source}: {e}")))?
            .format;
        if format != BACKUP_FORMAT {
            return Err(BackupError::UnknownFormat {
                found: format,
                supported: BACKUP_FORMAT,
            });
        }
        serde_json::from_str(text).map_err(|e| BackupError::Manifest(format!("{source}: {e}")))
    }
}

/// Why a backup cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// No manifest: the backup was never finished.
    #[error("{0} has no {MANIFEST_FILE}: the backup did not finish, or this is not a backup")]
    Incomplete(String),
    /// The manifest does not parse.
    #[error("invalid manifest {0}")]
    Manifest(String),
    /// The manifest's format is not one this build reads.
    #[error(
        "the backup has manifest format {found}, this build reads format {supported}: restore it with the Cairn version that wrote it"
    )]
    UnknownFormat {
        /// Format in the manifest.
        found: u32,
        /// Format this build reads.
        supported: u32,
    },
    /// A file differs from what the manifest says.
    #[error("{path}: {detail}")]
    FileMismatch {
        /// The file.
        path: String,
        /// What differs.
        detail: String,
    },
    /// The checkpoint holds other contents than the manifest says.
    #[error("the checkpoint does not hold what the manifest says: {0}")]
    ContentsMismatch(String),
    /// The target of a restore is not empty.
    #[error(
        "{0} is not empty: restore only into a new or empty data directory (nothing was changed)"
    )]
    TargetNotEmpty(PathBuf),
    /// Storage or filesystem failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| StoreError::io(context, e)
}

/// Whether `path` (from a manifest or a stream) stays inside a backup: relative, no `..`,
/// below [`DB_DIR`].
pub fn valid_file_path(path: &str) -> bool {
    let mut parts = path.split('/');
    let rest: Vec<&str> = match parts.next() {
        Some(DB_DIR) => parts.collect(),
        _ => return false,
    };
    !rest.is_empty()
        && rest
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != ".." && !p.contains(['\\', '\0']))
}

/// SHA-256 and size of a file's contents.
pub fn hash_file(path: &Path) -> Result<(u64, String), StoreError> {
    let mut f = File::open(path).map_err(io(format!("failed to open {}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io(format!("failed to read {}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The regular files below `root`, as `/`-separated paths relative to it, sorted.
pub fn list_files(root: &Path) -> Result<Vec<String>, StoreError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), StoreError> {
        for entry in fs::read_dir(dir).map_err(io(format!("failed to list {}", dir.display())))? {
            let entry = entry.map_err(io(format!("failed to list {}", dir.display())))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(io(format!("failed to stat {}", path.display())))?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

/// Reads what the checkpoint in `dir` holds, opening it read-only; with `count_events`,
/// every boundary's events are also counted one by one and must number its head (the
/// prepare positions are dense), which reads every event.
pub fn checkpoint_contents(
    dir: &Path,
    count_events: bool,
) -> Result<CheckpointContents, BackupError> {
    // RocksDB writes its info log even when it opens read-only, into the database's own
    // directory unless told otherwise (and renames the one it finds there): elsewhere, so
    // reading a backup never changes it.
    let log_dir = std::env::temp_dir().join(format!(
        "cairn-backup-read-{}-{}",
        std::process::id(),
        LOG_DIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _remove_log_dir = RemoveDir(log_dir.clone());
    let mut opts = Options::default();
    opts.set_db_log_dir(&log_dir);
    let db = DB::open_cf_for_read_only(&opts, dir, STATE_MACHINE_CFS, false)
        .map_err(StoreError::from)?;
    let catalog = Catalog::load(&db)?;
    let mut boundaries = Vec::new();
    for info in catalog.boundaries.values() {
        let events = catalog.heads.get(&info.id).copied().unwrap_or(0);
        if count_events {
            let counted = count_boundary_events(&db, info.id)?;
            if counted != events {
                return Err(BackupError::ContentsMismatch(format!(
                    "boundary {} holds {counted} events but its last one has prepare position {}",
                    info.name,
                    i128::from(events) - 1
                )));
            }
        }
        let (last_commit, last_prepare) = match events {
            0 => (-1, -1),
            n => (n as i64, n as i64 - 1),
        };
        boundaries.push(BoundaryContents {
            name: info.name.clone(),
            events,
            last_commit,
            last_prepare,
        });
    }
    Ok(CheckpointContents {
        boundaries,
        users: catalog.users.len() as u64,
        indexes: catalog.indexes.len() as u64,
        applied_marker: catalog.applied_marker.clone(),
    })
}

/// Numbers the scratch directories of [`checkpoint_contents`] within this process.
static LOG_DIRS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes a scratch directory when dropped.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Whether `path` names one of RocksDB's info logs (`LOG`, `LOG.old.<time>`): text for
/// people, rewritten whenever the database is opened, and no part of a backup.
pub fn is_info_log(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "LOG" || name.starts_with("LOG.old")
}

fn count_boundary_events(db: &DB, boundary: u32) -> Result<u64, StoreError> {
    let cf = db
        .cf_handle(CF_EVENTS)
        .ok_or(StoreError::MissingColumnFamily(CF_EVENTS))?;
    let prefix = boundary.to_be_bytes();
    let mut n = 0u64;
    let start = keys::event_key(boundary, 0);
    for item in db.iterator_cf(cf, IteratorMode::From(&start, rocksdb::Direction::Forward)) {
        let (k, _) = item?;
        if !k.starts_with(&prefix) {
            break;
        }
        n += 1;
    }
    Ok(n)
}

/// Checks the backup in `dir` against its manifest: the format, every file's presence,
/// size and SHA-256, no file the manifest does not name, and the checkpoint (opened
/// read-only, every event counted) holding the boundaries, users and indexes it names.
/// Reads every byte. Returns the manifest.
pub fn verify(dir: &Path) -> Result<Manifest, BackupError> {
    let manifest = read_manifest(dir)?;
    let named: BTreeMap<&str, &ManifestFile> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f))
        .collect();
    for file in &manifest.files {
        if !valid_file_path(&file.path) {
            return Err(BackupError::Manifest(format!(
                "{}: file path {:?} leaves the backup's {DB_DIR}/ directory",
                dir.display(),
                file.path
            )));
        }
        let path = dir.join(&file.path);
        if !path.is_file() {
            return Err(BackupError::FileMismatch {
                path: file.path.clone(),
                detail: "missing".into(),
            });
        }
        let (size, sha256) = hash_file(&path)?;
        if size != file.size {
            return Err(BackupError::FileMismatch {
                path: file.path.clone(),
                detail: format!("{size} bytes, the manifest says {}", file.size),
            });
        }
        if sha256 != file.sha256 {
            return Err(BackupError::FileMismatch {
                path: file.path.clone(),
                detail: format!(
                    "checksum mismatch: SHA-256 {sha256}, the manifest says {}",
                    file.sha256
                ),
            });
        }
    }
    for path in list_files(dir)? {
        if path != MANIFEST_FILE
            && path != VERIFIED_FILE
            && !is_info_log(&path)
            && !named.contains_key(path.as_str())
        {
            return Err(BackupError::FileMismatch {
                path,
                detail: "not named in the manifest".into(),
            });
        }
    }
    let contents = checkpoint_contents(&dir.join(DB_DIR), true)?;
    if contents.boundaries != manifest.boundaries {
        return Err(BackupError::ContentsMismatch(format!(
            "boundaries {:?}, the manifest says {:?}",
            contents.boundaries, manifest.boundaries
        )));
    }
    if (contents.users, contents.indexes) != (manifest.users, manifest.indexes) {
        return Err(BackupError::ContentsMismatch(format!(
            "{} users and {} indexes, the manifest says {} and {}",
            contents.users, contents.indexes, manifest.users, manifest.indexes
        )));
    }
    Ok(manifest)
}

/// Reads and parses `dir/manifest.json`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, BackupError> {
    let path = dir.join(MANIFEST_FILE);
    if !path.is_file() {
        return Err(BackupError::Incomplete(dir.display().to_string()));
    }
    let text =
        fs::read_to_string(&path).map_err(io(format!("failed to read {}", path.display())))?;
    Manifest::from_json(&text, &path.display().to_string())
}

/// Writes `manifest` as `dir/manifest.json`, durably and whole (a temporary file renamed),
/// the last step of taking a backup.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), StoreError> {
    crate::write_file_durably(&dir.join(MANIFEST_FILE), manifest.to_json().as_bytes())
}

/// Whether `dir` is missing or an empty directory.
pub fn is_empty_dir(dir: &Path) -> Result<bool, StoreError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(StoreError::io(
            format!("failed to list {}", dir.display()),
            e,
        )),
    }
}

/// Copies the verified backup in `backup` to `db_dir` (a new RocksDB directory, which
/// must be missing or empty) and readies it to start a new group: the Raft layer's applied
/// marker is removed, so the node that opens it has applied nothing of any log and forms
/// a new group of its own (positions are counted per boundary, not by log index, so they
/// go on from the restored events), and subscription leases are dropped (their holders
/// belong to the old cluster). Every file and directory is synced before it returns.
/// Verifies the backup first; nothing is written if that fails.
pub fn restore(backup: &Path, db_dir: &Path) -> Result<Manifest, BackupError> {
    restore_files(backup, db_dir, false, true)
}

/// [`restore`] (moving the files when `moving`, see [`restore_by_moving`]) for a replay
/// of archived log entries: the state machine keeps its applied marker, which the replay
/// goes on from (and needs: planned entries hold only on the state they were made on).
/// Call [`Store::forget_log_position`] once the replay is done.
pub fn restore_for_replay(
    backup: &Path,
    db_dir: &Path,
    moving: bool,
) -> Result<Manifest, BackupError> {
    restore_files(backup, db_dir, moving, false)
}

/// [`restore`] from a copy of a backup that is no longer needed (a download), on the same
/// file system as `db_dir`: its files are renamed into place instead of copied, so the
/// restore needs room for the backup once, not twice.
pub fn restore_by_moving(backup: &Path, db_dir: &Path) -> Result<Manifest, BackupError> {
    restore_files(backup, db_dir, true, true)
}

fn restore_files(
    backup: &Path,
    db_dir: &Path,
    moving: bool,
    forget: bool,
) -> Result<Manifest, BackupError> {
    if !is_empty_dir(db_dir)? {
        return Err(BackupError::TargetNotEmpty(db_dir.to_path_buf()));
    }
    let manifest = verify(backup)?;
    fs::create_dir_all(db_dir).map_err(io(format!("failed to create {}", db_dir.display())))?;
    for file in &manifest.files {
        let rel = file
            .path
            .strip_prefix(&format!("{DB_DIR}/"))
            .unwrap_or(&file.path);
        let to = db_dir.join(rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)
                .map_err(io(format!("failed to create {}", parent.display())))?;
        }
        let from = backup.join(&file.path);
        if moving {
            fs::rename(&from, &to).map_err(io(format!(
                "failed to move {} to {}",
                from.display(),
                to.display()
            )))?;
        } else {
            fs::copy(&from, &to).map_err(io(format!(
                "failed to copy {} to {}",
                from.display(),
                to.display()
            )))?;
        }
        File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(io(format!("failed to sync {}", to.display())))?;
    }
    sync_dir(db_dir)?;
    if let Some(parent) = db_dir.parent() {
        sync_dir(parent)?;
    }
    if forget {
        let store = Store::open(db_dir, &crate::StoreOptions::default())?;
        store.forget_log_position()?;
    }
    Ok(manifest)
}

impl Store {
    /// Removes the applied marker and every subscription lease, durably: the state
    /// machine then belongs to no log (see [`restore`]).
    pub fn forget_log_position(&self) -> Result<(), StoreError> {
        let _writer = self.lock_writer();
        let db = &self.inner.db;
        let cf = self.cf(CF_SM_META)?;
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_cf(cf, keys::meta::APPLIED);
        let leases: Vec<Box<[u8]>> = db
            .prefix_iterator_cf(cf, keys::meta::LEASE)
            .map(|item| item.map(|(k, _)| k))
            .take_while(|item| {
                item.as_ref()
                    .map_or(true, |k| k.starts_with(keys::meta::LEASE))
            })
            .collect::<Result<_, _>>()?;
        for key in &leases {
            batch.delete_cf(cf, key);
        }
        let mut sync = rocksdb::WriteOptions::default();
        sync.set_sync(true);
        db.write_opt(batch, &sync)?;
        self.flush()?;
        self.with_catalog_mut(|c| {
            c.applied_marker = None;
            c.leases.clear();
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use cairn_core::command::{Append, Command};
    use cairn_core::event::{NewEvent, RawEvent};

    use super::*;
    use crate::StoreOptions;

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

    fn append(boundary: &str, first: usize, n: usize) -> Command {
        Command::Append(Append {
            boundary: boundary.into(),
            observations: vec![],
            events: (0..n)
                .map(|i| {
                    let raw = RawEvent {
                        event_id: format!("{boundary}-{}", first + i),
                        event_type: "T".into(),
                        data: format!("{{\"n\":{}}}", first + i),
                        metadata: String::new(),
                    };
                    NewEvent::validate(raw, i).expect("valid")
                })
                .collect(),
            at_unix_nanos: 0,
        })
    }

    /// A backup of a store holding boundary `a` (7 events in two writes) and `b` (none),
    /// laid out as `cairn backup create` lays it out.
    fn backup_of_a_store(root: &Path) -> (PathBuf, Manifest) {
        let store = Store::open(root.join("live"), &StoreOptions::default()).expect("open");
        for (i, command) in [
            create("a"),
            create("b"),
            append("a", 0, 3),
            append("a", 3, 4),
        ]
        .iter()
        .enumerate()
        {
            let marker = format!("m{i}");
            store
                .apply(command, marker.as_bytes())
                .expect("apply")
                .expect("applied");
        }
        let backup = root.join("backup");
        fs::create_dir_all(&backup).expect("mkdir");
        store
            .create_checkpoint(&backup.join(DB_DIR))
            .expect("checkpoint");
        // Written after the checkpoint: not in the backup.
        store
            .apply(&append("a", 7, 1), b"m9")
            .expect("apply")
            .expect("applied");
        let contents = checkpoint_contents(&backup.join(DB_DIR), false).expect("contents");
        let files = list_files(&backup)
            .expect("list")
            .into_iter()
            .filter(|path| !is_info_log(path))
            .map(|path| {
                let (size, sha256) = hash_file(&backup.join(&path)).expect("hash");
                ManifestFile { path, size, sha256 }
            })
            .collect();
        let manifest = Manifest {
            format: BACKUP_FORMAT,
            cairn_version: "test".into(),
            created_unix_seconds: 0,
            cluster_id: None,
            node_id: 1,
            applied: AppliedPosition {
                index: 4,
                term: 1,
                partial_entry: None,
            },
            store_format: crate::STORE_FORMAT,
            boundaries: contents.boundaries,
            users: contents.users,
            indexes: contents.indexes,
            files,
        };
        write_manifest(&backup, &manifest).expect("manifest");
        (backup, manifest)
    }

    #[test]
    fn a_checkpoint_holds_each_boundary_up_to_the_moment_it_was_taken() {
        let tmp = tempfile::tempdir().expect("dir");
        let (_, manifest) = backup_of_a_store(tmp.path());
        assert_eq!(
            manifest.boundaries,
            vec![
                BoundaryContents {
                    name: "a".into(),
                    events: 7,
                    last_commit: 7,
                    last_prepare: 6,
                },
                BoundaryContents {
                    name: "b".into(),
                    events: 0,
                    last_commit: -1,
                    last_prepare: -1,
                },
            ]
        );
        assert!(manifest.files.iter().all(|f| valid_file_path(&f.path)));
        assert!(manifest.files.iter().any(|f| f.path.ends_with("CURRENT")));
    }

    #[test]
    fn reading_a_backup_changes_none_of_its_files() {
        let tmp = tempfile::tempdir().expect("dir");
        let (backup, _) = backup_of_a_store(tmp.path());
        let before = list_files(&backup).expect("list");
        verify(&backup).expect("verifies");
        verify(&backup).expect("verifies again");
        assert_eq!(list_files(&backup).expect("list"), before);
    }

    #[test]
    fn a_backup_verifies_and_a_changed_missing_or_extra_file_does_not() {
        let tmp = tempfile::tempdir().expect("dir");
        let (backup, manifest) = backup_of_a_store(tmp.path());
        assert_eq!(verify(&backup).expect("verifies"), manifest);

        let victim = manifest
            .files
            .iter()
            .find(|f| f.path.ends_with(".sst"))
            .expect("an sst");
        let path = backup.join(&victim.path);
        let original = fs::read(&path).expect("read");
        let mut flipped = original.clone();
        flipped[original.len() / 2] ^= 1;
        fs::write(&path, &flipped).expect("write");
        let e = verify(&backup).expect_err("a flipped bit");
        assert!(e.to_string().contains("checksum mismatch"), "{e}");

        fs::remove_file(&path).expect("remove");
        let e = verify(&backup).expect_err("a missing file");
        assert!(e.to_string().contains("missing"), "{e}");
        fs::write(&path, &original).expect("restore the file");

        fs::write(backup.join("db/extra"), b"x").expect("extra");
        let e = verify(&backup).expect_err("an extra file");
        assert!(e.to_string().contains("not named in the manifest"), "{e}");
        fs::remove_file(backup.join("db/extra")).expect("remove");

        fs::remove_file(backup.join(MANIFEST_FILE)).expect("remove");
        assert!(matches!(verify(&backup), Err(BackupError::Incomplete(_))));
    }

    #[test]
    fn a_manifest_that_claims_other_contents_is_refused() {
        let tmp = tempfile::tempdir().expect("dir");
        let (backup, mut manifest) = backup_of_a_store(tmp.path());
        manifest.boundaries[0].events = 8;
        write_manifest(&backup, &manifest).expect("manifest");
        let e = verify(&backup).expect_err("claims an event more");
        assert!(matches!(e, BackupError::ContentsMismatch(_)), "{e}");
    }

    #[test]
    fn a_restore_holds_the_backup_and_no_log_position_and_refuses_a_used_directory() {
        let tmp = tempfile::tempdir().expect("dir");
        let (backup, manifest) = backup_of_a_store(tmp.path());
        let target = tmp.path().join("restored/db");
        let restored = restore(&backup, &target).expect("restore");
        assert_eq!(restored, manifest);
        let store = Store::open(&target, &StoreOptions::default()).expect("open");
        assert_eq!(store.applied_marker(), None);
        let heads: Vec<(String, u64)> = store.with_catalog(|c| {
            c.boundaries
                .values()
                .map(|b| (b.name.clone(), c.heads[&b.id]))
                .collect()
        });
        assert_eq!(heads, vec![("a".into(), 7), ("b".into(), 0)]);
        drop(store);

        let e = restore(&backup, &target).expect_err("not empty");
        assert!(matches!(e, BackupError::TargetNotEmpty(_)), "{e}");

        let flipped_manifest = backup.join(MANIFEST_FILE);
        let text = fs::read_to_string(&flipped_manifest).expect("read");
        fs::write(
            &flipped_manifest,
            text.replace("\"format\": 1", "\"format\": 99"),
        )
        .expect("write");
        let fresh = tmp.path().join("fresh/db");
        let e = restore(&backup, &fresh).expect_err("unknown format");
        assert!(
            matches!(e, BackupError::UnknownFormat { found: 99, .. }),
            "{e}"
        );
        assert!(
            !fresh.exists(),
            "a refused restore wrote {}",
            fresh.display()
        );
    }

    #[test]
    fn file_paths_stay_below_the_checkpoint_directory() {
        assert!(valid_file_path("db/000012.sst"));
        assert!(valid_file_path("db/sub/MANIFEST-000005"));
        for bad in [
            "db",
            "db/",
            "/db/x",
            "db/../x",
            "x/000012.sst",
            "../db/x",
            "db/./x",
            "db\\x",
            "",
        ] {
            assert!(!valid_file_path(bad), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_manifest_of_another_format_is_refused_by_number() {
        let e = Manifest::from_json(r#"{"format": 2, "whatever": true}"#, "m").unwrap_err();
        assert!(
            matches!(
                e,
                BackupError::UnknownFormat {
                    found: 2,
                    supported: BACKUP_FORMAT
                }
            ),
            "{e}"
        );
        let e = Manifest::from_json("not json", "m").unwrap_err();
        assert!(matches!(e, BackupError::Manifest(_)), "{e}");
    }
}
