//! Cairn's state machine on RocksDB.
//!
//! One RocksDB instance per node holds the Raft log (written by `cairn-raft`) and the state
//! machine (written here), in separate column families (the layout is in `docs/design.md`).
//! [`Store::apply`] is the deterministic step every replica runs in log order: the CCC check
//! and the append land in one `WriteBatch` together with the applied-state marker, so a crash
//! leaves either all of an entry's effects or none. State-machine batches bypass the WAL: the
//! Raft log (which is in the WAL and fsynced) is the durable record, memtable flushes are
//! atomic across column families, and after a crash openraft re-applies the log entries
//! after the last flushed marker. Reads come from RocksDB snapshots and
//! answer every criterion from the tag index (X2), never by scanning the event log.
//!
//! All methods block on disk I/O: async callers run them under `spawn_blocking`.

mod apply;
pub mod backup;
mod catalog;
mod checkpoint;
#[cfg(fuzzing)]
pub mod fuzzing;
pub mod keys;
mod planned;
mod posting;
mod read;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, Options,
    SliceTransform,
};

pub use catalog::{Catalog, Lease};
pub use checkpoint::{
    pack_dir, packed_size, sync_dir, unpack_dir, unpack_from, unpack_into, write_file_durably,
};
pub use planned::{PlannedRun, RowCut, Speculation};
pub use read::{Direction, PageLimit, ReadStart, event_bytes};

/// Raft log entries, by index (written by cairn-raft).
pub const CF_RAFT_LOG: &str = "raft_log";
/// Raft vote / committed / purged markers (written by cairn-raft).
pub const CF_RAFT_META: &str = "raft_meta";
/// Events by boundary id · prepare.
pub const CF_EVENTS: &str = "events";
/// Tag posting lists: boundary id · key · value · prepare → commit.
pub const CF_TAGS: &str = "tags";
/// Normalised observations of conditional writes, by boundary id · commit.
pub const CF_WRITES: &str = "writes";
/// Event ids of boundaries with idempotent event ids (X1): boundary id · event id → prepare.
pub const CF_EVENT_IDS: &str = "event_ids";
/// Catalog, users, indexes, leases, applied marker.
pub const CF_SM_META: &str = "sm_meta";

/// Column families of the state machine (what a snapshot carries).
pub const STATE_MACHINE_CFS: [&str; 5] = [CF_EVENTS, CF_TAGS, CF_WRITES, CF_EVENT_IDS, CF_SM_META];
/// Every column family, in creation order.
pub const ALL_CFS: [&str; 7] = [
    CF_RAFT_LOG,
    CF_RAFT_META,
    CF_EVENTS,
    CF_TAGS,
    CF_WRITES,
    CF_EVENT_IDS,
    CF_SM_META,
];

/// On-disk format of the state machine, recorded in `sm_meta` when a database is created and
/// checked on every open. Bump it whenever a key or value changes meaning.
/// 1: tag keys/values over 64 bytes are keyed by digest.
/// 2: posting-list rows with a varint boundary id, one-byte part lengths and the commit as
///    a varint distance from the prepare position.
/// 3: one posting-list row per list and write, holding every event of the write that
///    carries the tag. A format-2 row is a valid one-event row, so format-2 directories are
///    upgraded in place (only the marker changes).
/// 4: `event_ids` indexes the event ids of boundaries with idempotent event ids (X1). A
///    format-3 directory has no such boundary, so it is upgraded in place; a build that
///    reads only format 3 refuses format 4 rather than store duplicates it should refuse.
pub const STORE_FORMAT: u32 = 4;
/// The oldest format [`check_format`] upgrades to [`STORE_FORMAT`] instead of refusing.
const UPGRADABLE_FORMAT: u32 = 2;

/// L0 files that trigger a compaction of the posting lists (RocksDB's default is 4).
pub const TAGS_L0_COMPACTION_TRIGGER: i32 = 8;

/// Default block cache shared by all column families.
pub const DEFAULT_BLOCK_CACHE_BYTES: usize = 256 * 1024 * 1024;
/// Default memtable size per column family (RocksDB's default).
pub const DEFAULT_MEMTABLE_BYTES: usize = 64 * 1024 * 1024;

/// Storage faults. Domain outcomes (conflicts, duplicates) are not errors here: they are
/// [`cairn_core::command::Outcome`] values, identical on every replica.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB reported an error.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A stored record could not be decoded.
    #[error("corrupt record in column family {cf}: {detail}")]
    Corrupt {
        /// Column family.
        cf: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The database lacks a column family it must have.
    #[error("column family {0} is missing")]
    MissingColumnFamily(&'static str),
    /// Filesystem error (checkpoints, snapshots).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A background task panicked or was cancelled.
    #[error("{0}")]
    Task(String),
    /// The data directory holds another on-disk format than this build reads.
    #[error(
        "the data directory has storage format {found}, this build reads format {supported}: \
         it was written by a different Cairn version (format 0 = a pre-release build without \
         format markers); start the version that wrote it, or move the directory aside"
    )]
    IncompatibleFormat {
        /// Format found on disk (0: none recorded although the directory holds state).
        found: u32,
        /// Format this build reads and writes.
        supported: u32,
    },
    /// RocksDB found the database damaged when opening it (a truncated or altered file).
    #[error(
        "the database under {path} is damaged, nothing was changed: {detail}. On a cluster \
         member, move the data directory aside and let the node rejoin from its peers; on a \
         single node, restore a backup (docs/operations.md, \"A damaged data directory\")"
    )]
    Damaged {
        /// The database directory.
        path: PathBuf,
        /// RocksDB's report, which names the damaged file.
        detail: String,
    },
    /// The state machine is half replaced by a snapshot install that did not finish.
    #[error(
        "the state machine cannot be read: {0}; a restart finishes the install from the same \
         snapshot"
    )]
    InstallIncomplete(String),
    /// Not enough free disk to install a snapshot; nothing was changed.
    #[error(
        "cannot install the snapshot: it needs {needed} bytes free under {}, {free} are free; \
         nothing was changed (free disk space or grow the volume, docs/replication.md)",
        path.display()
    )]
    NoSpaceForSnapshot {
        /// Where the snapshot is unpacked.
        path: PathBuf,
        /// Bytes the install needs (the unpacked snapshot and a margin).
        needed: u64,
        /// Bytes free for this process.
        free: u64,
    },
    /// The directory holds a RocksDB database some other program wrote.
    #[error(
        "{path} holds a RocksDB database that Cairn did not write (column families: {families}); \
         nothing was changed: point --data-dir at an empty directory or at a Cairn one"
    )]
    Foreign {
        /// The database directory.
        path: PathBuf,
        /// The column families it has.
        families: String,
    },
}

impl StoreError {
    pub(crate) fn corrupt(cf: &'static str, detail: &str) -> Self {
        StoreError::Corrupt {
            cf,
            detail: detail.to_string(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }
}

impl StoreError {
    /// True when the database is locked by another process (or another handle in this
    /// one): the previous owner of the data directory is still running.
    pub fn is_locked(&self) -> bool {
        matches!(self, StoreError::Rocks(e) if e.kind() == rocksdb::ErrorKind::IOError && e.to_string().contains("LOCK"))
    }
}

impl From<StoreError> for cairn_core::Error {
    fn from(e: StoreError) -> Self {
        match e {
            // Another node (or this one, once restarted) can answer: the client may retry.
            StoreError::InstallIncomplete(_) => cairn_core::Error::Unavailable(e.to_string()),
            other => cairn_core::Error::Internal(format!("storage failure: {other}")),
        }
    }
}

/// Storage tuning, validated by the server's config.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Shared block cache size in bytes.
    pub block_cache_bytes: usize,
    /// Memtable size per column family in bytes: a full one flushes every column family
    /// (atomic flush), so it sets how much is written between flushes.
    pub memtable_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            block_cache_bytes: DEFAULT_BLOCK_CACHE_BYTES,
            memtable_bytes: DEFAULT_MEMTABLE_BYTES,
        }
    }
}

struct Inner {
    db: Arc<DB>,
    path: PathBuf,
    catalog: RwLock<Catalog>,
    /// Serialises writers: apply, snapshot installation. Readers never take it.
    writer: Mutex<()>,
    /// Held shared by every consistent read for as long as it reads, and exclusively by a
    /// snapshot install: a read sees the state before the install or after it, never the
    /// half-replaced one. `Some` while the state is half replaced (an install failed, or
    /// one a crash interrupted was not resumed yet): reads are refused with the reason.
    gate: RwLock<Option<String>>,
}

/// Handle to the node's RocksDB: cheap to clone, safe to share across threads.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// The posting-list prefix of a `tags` key: everything but the trailing prepare position.
fn posting_list_prefix(key: &[u8]) -> &[u8] {
    &key[..key.len().saturating_sub(keys::PREPARE_BYTES)]
}

/// Whether `key` has a posting-list prefix (boundary id, two lengths and a position).
fn is_posting_key(key: &[u8]) -> bool {
    key.len() >= keys::MIN_TAG_PREFIX_BYTES + keys::PREPARE_BYTES
}

fn db_options(opts: &StoreOptions) -> (Options, Vec<ColumnFamilyDescriptor>) {
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.increase_parallelism(2);
    db_opts.set_max_background_jobs(2);
    db_opts.set_keep_log_file_num(5);
    // State-machine writes skip the WAL (see `Store::write`): only the Raft log needs it.
    // Atomic flush makes every memtable flush a consistent cut across column families, so
    // what survives a crash is always "everything up to some applied marker", never events
    // without their marker or a marker without its events.
    db_opts.set_atomic_flush(true);

    let cache = Cache::new_lru_cache(opts.block_cache_bytes);
    let mut cfs = ALL_CFS
        .iter()
        .map(|name| {
            let mut cf_opts = Options::default();
            cf_opts.set_write_buffer_size(opts.memtable_bytes);
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            // Posting-list seeks and event point reads dominate: whole-key bloom filters
            // make negative lookups cheap, and cached index blocks keep seeks off the disk.
            table.set_bloom_filter(10.0, false);
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            if *name == CF_TAGS {
                // A posting list's key is its prefix plus an 8-byte position. Prefix blooms
                // (in SSTs and the memtable) let a seek into a list that does not exist —
                // the common CCC check of a fresh context — skip every file at once.
                table.set_whole_key_filtering(false);
                cf_opts.set_prefix_extractor(SliceTransform::create(
                    "cairn.posting_list.v2",
                    posting_list_prefix,
                    Some(is_posting_key),
                ));
                cf_opts.set_memtable_prefix_bloom_ratio(0.05);
                // Posting lists have random keys, so every L0 compaction rewrites the
                // overlapping data below it; merging more L0 files at once writes each row
                // fewer times (wc-100 on a growing 1M boundary: +9%). 16 looked a little
                // better still for writes but made latest-by-criteria on a freshly seeded
                // 1M boundary slower at 16 clients (more L0 files per lookup), so it stays 8.
                cf_opts.set_level_zero_file_num_compaction_trigger(TAGS_L0_COMPACTION_TRIGGER);
            }
            if *name == CF_EVENT_IDS {
                // Nearly every lookup is of a new id (X1): a whole-key bloom in the memtable
                // answers the miss without a skiplist search among the latest ids.
                cf_opts.set_memtable_whole_key_filtering(true);
                cf_opts.set_memtable_prefix_bloom_ratio(0.1);
            }
            cf_opts.set_block_based_table_factory(&table);
            let compression = if *name == CF_TAGS || *name == CF_SM_META {
                DBCompressionType::None
            } else {
                DBCompressionType::Lz4
            };
            cf_opts.set_compression_type(compression);
            ColumnFamilyDescriptor::new(*name, cf_opts)
        })
        .collect::<Vec<_>>();
    // Unused, but RocksDB preallocates each WAL file at 1.1 times the largest memtable of
    // any family, this one's included (64 MiB unless set): with it sized like the others,
    // a small disk is not taken by an empty WAL.
    let mut default_opts = Options::default();
    default_opts.set_write_buffer_size(opts.memtable_bytes);
    cfs.push(ColumnFamilyDescriptor::new(
        rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
        default_opts,
    ));
    (db_opts, cfs)
}

/// Writes [`STORE_FORMAT`] as the database's format, synced.
fn record_format(db: &DB, meta_cf: &rocksdb::ColumnFamily) -> Result<(), StoreError> {
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(true);
    db.put_cf_opt(
        meta_cf,
        keys::meta::FORMAT,
        catalog::encode_json(&STORE_FORMAT),
        &opts,
    )?;
    Ok(())
}

/// Records [`STORE_FORMAT`] in a new database; refuses one written in another format, so a
/// build never misreads keys it would encode differently.
fn check_format(db: &DB) -> Result<(), StoreError> {
    let meta_cf = db
        .cf_handle(CF_SM_META)
        .ok_or(StoreError::MissingColumnFamily(CF_SM_META))?;
    let found = match db.get_cf(meta_cf, keys::meta::FORMAT)? {
        Some(bytes) => catalog::decode_json::<u32>("format", &bytes)?,
        None if db.get_cf(meta_cf, keys::meta::APPLIED)?.is_some() => 0,
        None => {
            record_format(db, meta_cf)?;
            STORE_FORMAT
        }
    };
    if (UPGRADABLE_FORMAT..STORE_FORMAT).contains(&found) {
        record_format(db, meta_cf)?;
        tracing::info!("upgraded the storage format from {found} to {STORE_FORMAT}");
        return Ok(());
    }
    if found != STORE_FORMAT {
        return Err(StoreError::IncompatibleFormat {
            found,
            supported: STORE_FORMAT,
        });
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the database under `path` and loads the catalog.
    pub fn open(path: impl AsRef<Path>, opts: &StoreOptions) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        std::fs::create_dir_all(&path)
            .map_err(|e| StoreError::io(format!("failed to create {}", path.display()), e))?;
        let damaged = |e: rocksdb::Error| match e.kind() {
            rocksdb::ErrorKind::Corruption => StoreError::Damaged {
                path: path.clone(),
                detail: e.into_string(),
            },
            _ => StoreError::Rocks(e),
        };
        // Opening creates missing column families: look first, so that another program's
        // database is refused instead of being written into.
        if path.join("CURRENT").exists() {
            let families = DB::list_cf(&Options::default(), &path).map_err(damaged)?;
            if !families.iter().any(|f| f == CF_SM_META) {
                return Err(StoreError::Foreign {
                    path,
                    families: families.join(", "),
                });
            }
        }
        let (db_opts, cfs) = db_options(opts);
        let db = DB::open_cf_descriptors(&db_opts, &path, cfs).map_err(damaged)?;
        for name in ALL_CFS {
            if db.cf_handle(name).is_none() {
                return Err(StoreError::MissingColumnFamily(name));
            }
        }
        check_format(&db)?;
        let db = Arc::new(db);
        let catalog = Catalog::load(&db)?;
        let gate = checkpoint::pending_install_of(&db)?.map(|dir| {
            format!(
                "a snapshot install from {} was interrupted and has not been resumed",
                dir.display()
            )
        });
        Ok(Store {
            inner: Arc::new(Inner {
                db,
                path,
                catalog: RwLock::new(catalog),
                writer: Mutex::new(()),
                gate: RwLock::new(gate),
            }),
        })
    }

    /// The RocksDB handle, for the Raft log store sharing this database.
    pub fn db(&self) -> &Arc<DB> {
        &self.inner.db
    }

    /// Directory of the database.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub(crate) fn cf(&self, name: &'static str) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.inner
            .db
            .cf_handle(name)
            .ok_or(StoreError::MissingColumnFamily(name))
    }

    /// Takes the writer lock: apply, snapshot creation and installation never interleave.
    pub(crate) fn lock_writer(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens the read gate (shared): fails while an install has half replaced the state.
    pub(crate) fn read_gate(
        &self,
    ) -> Result<std::sync::RwLockReadGuard<'_, Option<String>>, StoreError> {
        let gate = self
            .inner
            .gate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*gate {
            Some(reason) => Err(StoreError::InstallIncomplete(reason.clone())),
            None => Ok(gate),
        }
    }

    /// Closes the read gate for an install: waits for every read in progress to finish.
    pub(crate) fn close_gate(&self) -> std::sync::RwLockWriteGuard<'_, Option<String>> {
        self.inner
            .gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` with read access to the catalog.
    pub fn with_catalog<T>(&self, f: impl FnOnce(&Catalog) -> T) -> T {
        let guard = self
            .inner
            .catalog
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&guard)
    }

    pub(crate) fn with_catalog_mut<T>(&self, f: impl FnOnce(&mut Catalog) -> T) -> T {
        let mut guard = self
            .inner
            .catalog
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }

    /// The Raft layer's applied-state marker as last written, if any.
    pub fn applied_marker(&self) -> Option<Vec<u8>> {
        self.with_catalog(|c| c.applied_marker.clone())
    }

    /// Approximate on-disk and in-memory sizes for metrics: (live SST bytes, pending
    /// compaction bytes, memtable bytes), summed over column families.
    pub fn size_stats(&self) -> (u64, u64, u64) {
        let mut totals = (0, 0, 0);
        for name in ALL_CFS {
            let Ok(cf) = self.cf(name) else { continue };
            let prop = |p: &str| {
                self.inner
                    .db
                    .property_int_value_cf(cf, p)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            };
            totals.0 += prop("rocksdb.live-sst-files-size");
            totals.1 += prop("rocksdb.estimate-pending-compaction-bytes");
            totals.2 += prop("rocksdb.cur-size-all-mem-tables");
        }
        totals
    }

    /// Flushes every memtable to SST files, atomically across column families (the
    /// state machine is not in the WAL, so a per-family flush could persist events without
    /// their applied marker).
    pub fn flush(&self) -> Result<(), StoreError> {
        let cfs = ALL_CFS
            .iter()
            .map(|name| self.cf(name))
            .collect::<Result<Vec<_>, _>>()?;
        self.inner
            .db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())?;
        Ok(())
    }

    /// Flushes the WAL to disk (used at shutdown).
    pub fn sync_wal(&self) -> Result<(), StoreError> {
        self.inner.db.flush_wal(true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_table_file_is_reported_by_name_and_nothing_changes() {
        let dir = tempfile::tempdir().expect("dir");
        let opts = StoreOptions::default();
        let store = Store::open(dir.path(), &opts).expect("create");
        store
            .db()
            .put_cf(store.cf(CF_EVENTS).expect("cf"), b"k", b"v")
            .expect("put");
        store.flush().expect("flush");
        drop(store);
        let sst = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").path())
            .find(|p| p.extension().is_some_and(|x| x == "sst"))
            .expect("a table file");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&sst)
            .expect("open")
            .set_len(10)
            .expect("truncate");
        let err = Store::open(dir.path(), &opts).expect_err("damaged");
        let message = err.to_string();
        assert!(matches!(err, StoreError::Damaged { .. }), "{message}");
        let name = sst
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(message.contains(&name), "{message}");
        assert!(message.contains("rejoin"), "{message}");
        assert_eq!(std::fs::metadata(&sst).expect("stat").len(), 10);
    }

    #[test]
    fn another_programs_database_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let mut opts = Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let db = DB::open_cf(&opts, dir.path(), ["theirs"]).expect("their database");
            db.put(b"their", b"data").expect("put");
        }
        let err = Store::open(dir.path(), &StoreOptions::default()).expect_err("foreign");
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("theirs"), "{err}");
        let families = DB::list_cf(&Options::default(), dir.path()).expect("list");
        assert_eq!(families, vec!["default".to_string(), "theirs".to_string()]);
    }

    #[test]
    fn the_format_is_recorded_on_create_and_checked_on_open() {
        let dir = tempfile::tempdir().expect("dir");
        let opts = StoreOptions::default();
        let store = Store::open(dir.path(), &opts).expect("create");
        drop(store);
        // Reopening the same format works.
        let store = Store::open(dir.path(), &opts).expect("reopen");
        let cf = store.cf(CF_SM_META).expect("cf");
        store
            .db()
            .put_cf(
                cf,
                keys::meta::FORMAT,
                catalog::encode_json(&(STORE_FORMAT + 1)),
            )
            .expect("put");
        store.flush().expect("flush");
        drop(store);
        let err = Store::open(dir.path(), &opts).expect_err("another format");
        assert!(
            matches!(err, StoreError::IncompatibleFormat { found, supported }
                if found == STORE_FORMAT + 1 && supported == STORE_FORMAT),
            "{err}"
        );
    }

    #[test]
    fn formats_two_and_three_are_upgraded_in_place_and_format_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let opts = StoreOptions::default();
        let set_format = |format: u32| {
            let store = Store::open(dir.path(), &opts).expect("open");
            let cf = store.cf(CF_SM_META).expect("cf");
            store
                .db()
                .put_cf(cf, keys::meta::FORMAT, catalog::encode_json(&format))
                .expect("put");
            store.flush().expect("flush");
        };
        for old in [2, 3] {
            set_format(old);
            let store = Store::open(dir.path(), &opts).expect("an older format opens");
            let cf = store.cf(CF_SM_META).expect("cf");
            let marker = store.db().get_cf(cf, keys::meta::FORMAT).expect("get");
            assert_eq!(
                marker,
                Some(catalog::encode_json(&STORE_FORMAT)),
                "from {old}"
            );
            drop(store);
        }
        set_format(1);
        let err = Store::open(dir.path(), &opts).expect_err("format 1");
        assert!(
            matches!(err, StoreError::IncompatibleFormat { found: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn state_without_a_format_marker_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let opts = StoreOptions::default();
        let store = Store::open(dir.path(), &opts).expect("create");
        let cf = store.cf(CF_SM_META).expect("cf");
        store
            .db()
            .put_cf(cf, keys::meta::APPLIED, b"x")
            .expect("put");
        store
            .db()
            .delete_cf(cf, keys::meta::FORMAT)
            .expect("delete");
        store.flush().expect("flush");
        drop(store);
        let err = Store::open(dir.path(), &opts).expect_err("pre-format state");
        assert!(
            matches!(err, StoreError::IncompatibleFormat { found: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("format 0"), "{err}");
    }
}
