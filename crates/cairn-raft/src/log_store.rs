//! The Raft log on RocksDB (column families `raft_log` and `raft_meta` of the node's DB).
//!
//! Keys of `raft_log` are big-endian log indexes, so iteration order is log order. Every
//! mutation that openraft must be able to rely on after a crash is on disk before it is
//! acknowledged: votes, truncations and purges are written with `sync = true`; appended
//! entries are written at once (so they are readable when `append` returns, as openraft
//! requires) and made durable by the syncer thread, which fsyncs the WAL once for every
//! append that arrived while the previous fsync ran and only then reports them persisted.
//! That is group commit: under load one fsync covers many writes. It does not take the
//! fsync off the Raft core's path: openraft 0.9 waits for the flush callback before it
//! goes on (`raft_core.rs`, the append's `LogFlushed`), so a slow disk still slows
//! replication; what the syncer saves is fsyncs, not waiting.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, RaftLogReader, StorageIOError, Vote};
use rocksdb::{DB, WriteBatch, WriteOptions};

use crate::codec::{decode, encode, encode_entry};
use crate::{StorageError, TypeConfig};
use cairn_store::{CF_RAFT_LOG, CF_RAFT_META};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// Upper bound of the encoded bytes of appended entries kept in memory until read back.
const UNREAD_BYTES_LIMIT: usize = 64 * 1024 * 1024;

/// Appended entries not yet applied. openraft reads every committed entry back to apply it,
/// and a leader's replication streams read each entry for every follower; handing over the
/// entry that `append` received saves decoding it again (a copy and an allocation per
/// string of every event), and its proposal carries its encoding for the AppendEntries. The
/// replication streams get clones (the command is shared, not copied); the apply reader
/// takes an entry, and any later read of it comes from RocksDB, which always holds the same
/// bytes.
#[derive(Default)]
struct Unread {
    entries: BTreeMap<u64, (Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl Unread {
    fn insert(&mut self, entry: Entry<TypeConfig>, bytes: usize) {
        if let Some((_, old)) = self.entries.insert(entry.log_id.index, (entry, bytes)) {
            self.bytes -= old;
        }
        self.bytes += bytes;
        while self.bytes > UNREAD_BYTES_LIMIT {
            let Some((_, (_, dropped))) = self.entries.pop_first() else {
                break;
            };
            self.bytes -= dropped;
        }
    }

    /// Whether every entry of `[start, end)` (not empty) is here.
    fn holds(&self, start: u64, end: u64) -> bool {
        end > start && self.entries.range(start..end).count() as u64 == end - start
    }

    /// Takes `[start, end)` if every entry of it is here.
    fn take(&mut self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        if !self.holds(start, end) {
            return None;
        }
        let taken = (start..end)
            .filter_map(|i| self.entries.remove(&i))
            .map(|(entry, bytes)| {
                self.bytes -= bytes;
                entry
            })
            .collect();
        Some(taken)
    }

    /// Clones of `[start, end)` if every entry of it is here.
    fn peek(&self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        if !self.holds(start, end) {
            return None;
        }
        Some(
            self.entries
                .range(start..end)
                .map(|(_, (entry, _))| entry.clone())
                .collect(),
        )
    }

    /// Forgets entries at or after `index` (log truncation).
    fn truncate(&mut self, index: u64) {
        let dropped = self.entries.split_off(&index);
        self.forget(&dropped);
    }

    /// Forgets entries up to and including `index` (log purge).
    fn purge(&mut self, index: u64) {
        let kept = self.entries.split_off(&index.saturating_add(1));
        let dropped = std::mem::replace(&mut self.entries, kept);
        self.forget(&dropped);
    }

    fn forget(&mut self, dropped: &BTreeMap<u64, (Entry<TypeConfig>, usize)>) {
        self.bytes -= dropped.values().map(|(_, b)| b).sum::<usize>();
    }
}

/// What the log archive still needs. openraft purges the log behind its snapshots; while a
/// node archives (or may take over archiving), entries the archive does not hold yet stay on
/// disk past openraft's purge, which only moves the purge marker: openraft never reads
/// below it, the archiver does.
struct ArchiveHold {
    /// Entries below this may be deleted (`u64::MAX`: no archive, delete as openraft says).
    archived_next: AtomicU64,
    /// openraft's purge marker + 1: entries below it are purged as far as openraft knows.
    purged_next: AtomicU64,
}

/// The Raft log store. Cheap to clone: clones share the database, the syncer and the
/// unread entries.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    syncer: Arc<Syncer>,
    unread: Arc<Mutex<Unread>>,
    hold: Arc<ArchiveHold>,
    /// A replication stream's reader ([`RaftLogStorage::get_log_reader`]): it reads
    /// unapplied entries without taking them from the apply reader.
    peeks: bool,
}

/// The syncer thread's handle. Dropping the last clone of the log store stops the thread and
/// joins it, so the thread never holds the last reference to the database: RocksDB must be
/// closed before the process exits, or its static destructors race the close and abort
/// ("pthread lock: Invalid argument").
struct Syncer {
    pending: Option<std::sync::mpsc::Sender<LogFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    fn send(&self, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError> {
        self.pending
            .as_ref()
            .and_then(|pending| pending.send(callback).ok())
            .ok_or_else(|| write_err(AnyError::error("the raft log syncer has stopped")))
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        drop(self.pending.take());
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            if thread.join().is_err() {
                tracing::error!("the raft log syncer thread panicked");
            }
        }
    }
}

/// The syncer thread: waits for appended-but-unsynced entries, fsyncs the WAL once for all of
/// them, then tells openraft they are persisted. Ends when every `LogStore` is dropped.
fn run_syncer(db: Arc<DB>, pending: std::sync::mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = pending.recv() {
        let mut batch = vec![first];
        batch.extend(pending.try_iter());
        match db.flush_wal(true) {
            Ok(()) => {
                for callback in batch {
                    callback.log_io_completed(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!("failed to sync the raft log: {e}");
                for callback in batch {
                    callback.log_io_completed(Err(std::io::Error::other(format!(
                        "failed to sync the raft log: {e}"
                    ))));
                }
            }
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogStore")
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The log index a `raft_log` key names.
fn index_of(key: &[u8]) -> Result<u64, StorageError> {
    key.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| read_err(AnyError::error("raft_log key is not 8 bytes")))
}

fn read_err(e: impl Into<AnyError>) -> StorageError {
    StorageIOError::read_logs(e).into()
}

fn write_err(e: impl Into<AnyError>) -> StorageError {
    StorageIOError::write_logs(e).into()
}

fn missing_cf(name: &str) -> AnyError {
    AnyError::error(format!("column family {name} is missing"))
}

async fn blocking<T, F>(f: F) -> Result<T, StorageError>
where
    F: FnOnce() -> Result<T, StorageError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| write_err(AnyError::error(format!("log storage task failed: {e}"))))?
}

impl LogStore {
    /// A log store over the node's database (column families already exist). Starts the
    /// syncer thread.
    pub fn new(db: Arc<DB>) -> std::io::Result<Self> {
        let (sender, pending) = std::sync::mpsc::channel();
        let thread_db = db.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-log-sync".to_string())
            .spawn(move || run_syncer(thread_db, pending))?;
        let store = LogStore {
            db,
            syncer: Arc::new(Syncer {
                pending: Some(sender),
                thread: Some(thread),
            }),
            unread: Arc::default(),
            hold: Arc::new(ArchiveHold {
                archived_next: AtomicU64::new(u64::MAX),
                purged_next: AtomicU64::new(0),
            }),
            peeks: false,
        };
        let purged: Option<LogId<u64>> = store
            .meta_get(KEY_LAST_PURGED)
            .map_err(|e| std::io::Error::other(format!("failed to read the purge marker: {e}")))?;
        store
            .hold
            .purged_next
            .store(purged.map_or(0, |id| id.index + 1), Ordering::SeqCst);
        Ok(store)
    }

    /// Keeps every entry on disk until [`LogStore::archived`] says the archive holds it,
    /// whatever openraft purges. Call before the node starts.
    pub fn hold_for_archive(&self) {
        self.hold.archived_next.store(0, Ordering::SeqCst);
    }

    /// The archive holds every entry up to `through`: deletes those openraft has purged.
    pub fn archived(&self, through: u64) -> Result<(), StorageError> {
        let next = through.saturating_add(1);
        let previous = self.hold.archived_next.fetch_max(next, Ordering::SeqCst);
        if previous == u64::MAX || previous >= next {
            return Ok(());
        }
        let end = next.min(self.hold.purged_next.load(Ordering::SeqCst));
        if end == 0 {
            return Ok(());
        }
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| write_err(missing_cf(CF_RAFT_LOG)))?;
        self.db
            .delete_range_cf(cf, index_key(0), index_key(end))
            .map_err(|e| write_err(&e))
    }

    /// The first index this node's log holds on disk (purged or not), if any.
    pub fn first_index_on_disk(&self) -> Result<Option<u64>, StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| read_err(missing_cf(CF_RAFT_LOG)))?;
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_to_first();
        match it.key() {
            Some(k) => index_of(k).map(Some),
            None => {
                it.status().map_err(|e| read_err(&e))?;
                Ok(None)
            }
        }
    }

    /// Entries `from..=through` as stored (for the archive), consecutive from `from`, up
    /// to about `max_bytes`; fewer (maybe none) where the log on disk has none. Blocking.
    pub fn stored_entries(
        &self,
        from: u64,
        through: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| read_err(missing_cf(CF_RAFT_LOG)))?;
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek(index_key(from));
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut expected = from;
        while let Some((k, v)) = it.item() {
            let index = index_of(k)?;
            if index > through || index != expected || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            bytes += v.len();
            out.push((index, v.to_vec()));
            expected += 1;
            it.next();
        }
        it.status().map_err(|e| read_err(&e))?;
        Ok(out)
    }

    fn unread(&self) -> std::sync::MutexGuard<'_, Unread> {
        self.unread.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn synced() -> WriteOptions {
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        opts
    }

    fn meta_get<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_META)
            .ok_or_else(|| read_err(missing_cf(CF_RAFT_META)))?;
        match self.db.get_cf(cf, key).map_err(|e| read_err(&e))? {
            Some(bytes) => Ok(Some(decode(&bytes).map_err(|e| read_err(&e))?)),
            None => Ok(None),
        }
    }

    fn meta_put<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
        sync: bool,
    ) -> Result<(), StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_META)
            .ok_or_else(|| write_err(missing_cf(CF_RAFT_META)))?;
        let bytes = encode(value).map_err(|e| write_err(&e))?;
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        self.db
            .put_cf_opt(cf, key, bytes, &opts)
            .map_err(|e| write_err(&e))
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId<u64>>, StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| read_err(missing_cf(CF_RAFT_LOG)))?;
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_to_last();
        match it.value() {
            Some(v) => {
                let entry: Entry<TypeConfig> = decode(v).map_err(|e| read_err(&e))?;
                Ok(Some(entry.log_id))
            }
            None => {
                it.status().map_err(|e| read_err(&e))?;
                Ok(None)
            }
        }
    }

    fn read_range(
        &self,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| read_err(missing_cf(CF_RAFT_LOG)))?;
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek(index_key(start));
        let mut out = Vec::new();
        while let Some((k, v)) = it.item() {
            let index = index_of(k)?;
            if end.is_some_and(|end| index >= end) {
                break;
            }
            out.push(decode(v).map_err(|e| read_err(&e))?);
            it.next();
        }
        it.status().map_err(|e| read_err(&e))?;
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Some(e + 1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        if let Some(end) = end {
            let mut unread = self.unread();
            let entries = if self.peeks {
                unread.peek(start, end)
            } else {
                unread.take(start, end)
            };
            if let Some(entries) = entries {
                return Ok(entries);
            }
        }
        // Entries held for the archive lie below openraft's purge marker: not its to read.
        let start = if self.hold.archived_next.load(Ordering::SeqCst) == u64::MAX {
            start
        } else {
            start.max(self.hold.purged_next.load(Ordering::SeqCst))
        };
        let this = self.clone();
        blocking(move || this.read_range(start, end)).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let this = self.clone();
        blocking(move || {
            let last_purged: Option<LogId<u64>> = this.meta_get(KEY_LAST_PURGED)?;
            let last = this.last_entry_log_id()?.or(last_purged);
            Ok(LogState {
                last_purged_log_id: last_purged,
                last_log_id: last,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogStore {
            peeks: true,
            ..self.clone()
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let this = self.clone();
        let vote = *vote;
        blocking(move || {
            this.meta_put(KEY_VOTE, &vote, true)
                .map_err(|e| StorageIOError::write_vote(&e).into())
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        let this = self.clone();
        blocking(move || this.meta_get(KEY_VOTE)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        // Not synced: it only lets a restarted node re-apply sooner; losing it is harmless.
        let this = self.clone();
        blocking(move || this.meta_put(KEY_COMMITTED, &committed, false)).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
        let this = self.clone();
        blocking(move || {
            Ok(this
                .meta_get::<Option<LogId<u64>>>(KEY_COMMITTED)?
                .flatten())
        })
        .await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let cf = self
            .db
            .cf_handle(CF_RAFT_LOG)
            .ok_or_else(|| write_err(missing_cf(CF_RAFT_LOG)))?;
        let mut batch = WriteBatch::default();
        let mut appended = Vec::new();
        for entry in entries {
            // Copies a proposal's remembered bytes when it has them (a follower's entries
            // from the leader's message); the leader's own entries remember theirs here, for
            // the AppendEntries that read them back.
            let bytes = encode_entry(&entry).map_err(|e| write_err(&e))?;
            let len = bytes.len();
            batch.put_cf(cf, index_key(entry.log_id.index), bytes);
            appended.push((entry, len));
        }
        // Not synced here: the write only reaches RocksDB's memtable and the WAL file's page
        // cache (microseconds), which makes the entries readable at once. Durability comes
        // from the syncer's fsync before the callback reports them persisted.
        let mut opts = WriteOptions::default();
        opts.set_sync(false);
        self.db.write_opt(batch, &opts).map_err(|e| write_err(&e))?;
        {
            let mut unread = self.unread();
            for (entry, len) in appended {
                unread.insert(entry, len);
            }
        }
        self.syncer.send(callback)
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.unread().truncate(log_id.index);
        let this = self.clone();
        blocking(move || {
            let cf = this
                .db
                .cf_handle(CF_RAFT_LOG)
                .ok_or_else(|| write_err(missing_cf(CF_RAFT_LOG)))?;
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(cf, index_key(log_id.index), index_key(u64::MAX));
            batch.delete_cf(cf, index_key(u64::MAX));
            this.db
                .write_opt(batch, &LogStore::synced())
                .map_err(|e| write_err(&e))
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        self.unread().purge(log_id.index);
        let this = self.clone();
        blocking(move || {
            let log_cf = this
                .db
                .cf_handle(CF_RAFT_LOG)
                .ok_or_else(|| write_err(missing_cf(CF_RAFT_LOG)))?;
            let meta_cf = this
                .db
                .cf_handle(CF_RAFT_META)
                .ok_or_else(|| write_err(missing_cf(CF_RAFT_META)))?;
            let mut batch = WriteBatch::default();
            // The purge marker and the deletion land together, so the log state is never
            // "purged up to X" with entries ≤ X still present, or vice versa — but for
            // entries held for the archive, which nothing but the archiver reads.
            batch.put_cf(
                meta_cf,
                KEY_LAST_PURGED,
                encode(&log_id).map_err(|e| write_err(&e))?,
            );
            let archived_next = this.hold.archived_next.load(Ordering::SeqCst);
            batch.delete_range_cf(
                log_cf,
                index_key(0),
                index_key((log_id.index + 1).min(archived_next)),
            );
            this.db
                .write_opt(batch, &LogStore::synced())
                .map_err(|e| write_err(&e))?;
            this.hold
                .purged_next
                .fetch_max(log_id.index + 1, Ordering::SeqCst);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(entries: &[Entry<TypeConfig>]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[test]
    fn unread_entries_are_taken_once_and_only_whole_ranges() {
        let mut unread = Unread::default();
        for i in 1..=5 {
            unread.insert(entry(i), 10);
        }
        assert!(unread.take(0, 3).is_none(), "index 0 was never appended");
        assert!(unread.take(3, 3).is_none(), "empty range");
        assert_eq!(indexes(&unread.take(2, 4).expect("cached")), vec![2, 3]);
        assert!(
            unread.take(2, 4).is_none(),
            "taken entries are read from disk"
        );
        assert!(unread.take(1, 3).is_none(), "a gap means disk");
        assert_eq!(unread.bytes, 30);
    }

    #[test]
    fn truncate_purge_and_the_byte_bound_forget_entries() {
        let mut unread = Unread::default();
        for i in 1..=6 {
            unread.insert(entry(i), 10);
        }
        unread.truncate(5); // 5 and 6 go
        unread.purge(2); // 1 and 2 go
        assert_eq!(
            unread.entries.keys().copied().collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(unread.bytes, 20);
        // Re-appending an index replaces it without double counting.
        unread.insert(entry(4), 15);
        assert_eq!(unread.bytes, 25);
        // Over the bound the oldest entries are dropped (they stay readable from disk).
        unread.insert(entry(5), UNREAD_BYTES_LIMIT);
        assert_eq!(unread.entries.keys().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(unread.bytes, UNREAD_BYTES_LIMIT);
    }
}
