//! State-machine snapshots for Raft: a RocksDB checkpoint (hard links, cheap to take) and a
//! single-file packing of it for transfer to another node.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{DB, IteratorMode, Options, WriteBatch, WriteOptions};

use crate::catalog::Catalog;
use crate::{ALL_CFS, CF_RAFT_LOG, CF_RAFT_META, STATE_MACHINE_CFS, Store, StoreError};

const PACK_MAGIC: &[u8] = b"CAIRN-SNAPSHOT-1\n";
/// Upper bound of a key in any state-machine column family (all start below 0xff).
const KEY_SPACE_END: [u8; 16] = [0xff; 16];
/// Size at which a copy batch is written while installing.
const INSTALL_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Key (default column family, outside the state machine) naming the checkpoint whose
/// installation has begun and not finished. Installing replaces the state machine in
/// several writes; if the process dies in between, the next open finishes the job from the
/// same checkpoint before anything reads the half-replaced state.
const INSTALL_PENDING: &[u8] = b"install_pending";

impl Store {
    /// Takes a checkpoint of the state machine into `dir` (which must not exist) and
    /// returns the applied marker it corresponds to. Holds the writer lock so that no entry
    /// is applied between the marker and the checkpoint. The checkpoint carries the state
    /// machine's column families only: the Raft log stays with each node.
    pub fn create_checkpoint(&self, dir: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        // The checkpoint flushes the memtables while holding the writer lock, which stalls
        // apply for as long as the flush takes (hundreds of milliseconds with full
        // memtables). Flushing first, unlocked, leaves it only what arrives meanwhile.
        self.flush()?;
        let marker = {
            let _writer = self.lock_writer();
            let marker = self.with_catalog(|c| c.applied_marker.clone());
            Checkpoint::new(&self.inner.db)?.create_checkpoint(dir)?;
            marker
        };
        drop_raft_column_families(dir)?;
        Ok(marker)
    }

    /// Replaces the state machine with the one in checkpoint `dir`, then reloads the
    /// catalog. The Raft log column families are left alone. Invisible to readers: the
    /// read gate is closed from the first change to the reloaded catalog, so every read
    /// sees the state before or the state after. Crash-safe: `dir` must be complete and
    /// synced (see [`unpack_into`]) before this is called, and is named by a synced marker
    /// before anything changes; [`Store::resume_install`] finishes the job after a crash.
    pub fn install_checkpoint(&self, dir: &Path) -> Result<(), StoreError> {
        let _writer = self.lock_writer();
        let mut gate = self.close_gate();
        let db = &self.inner.db;
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        let path = dir.to_string_lossy();
        db.put_opt(INSTALL_PENDING, path.as_bytes(), &sync)?;
        // Stays closed if anything below fails: the state is half replaced until a restart
        // resumes the install.
        *gate = Some(format!(
            "installing the snapshot in {} did not finish",
            dir.display()
        ));
        self.copy_state_machine(dir)?;
        db.delete_opt(INSTALL_PENDING, &sync)?;
        let catalog = Catalog::load(db)?;
        self.with_catalog_mut(|c| *c = catalog);
        *gate = None;
        Ok(())
    }

    /// The checkpoint an interrupted installation was copying, if one was: the state
    /// machine is half replaced until [`Store::resume_install`] finishes it.
    pub fn pending_install(&self) -> Result<Option<PathBuf>, StoreError> {
        pending_install_of(&self.inner.db)
    }

    /// Finishes an installation a crash interrupted (a no-op when none was).
    pub fn resume_install(&self) -> Result<Option<PathBuf>, StoreError> {
        let Some(dir) = self.pending_install()? else {
            return Ok(None);
        };
        self.install_checkpoint(&dir)?;
        Ok(Some(dir))
    }

    fn copy_state_machine(&self, dir: &Path) -> Result<(), StoreError> {
        let source = DB::open_cf_for_read_only(&Options::default(), dir, STATE_MACHINE_CFS, false)?;
        let db = &self.inner.db;
        for name in STATE_MACHINE_CFS {
            let live = self.cf(name)?;
            let from = source
                .cf_handle(name)
                .ok_or(StoreError::MissingColumnFamily(name))?;
            // Whole table files go at once, without being rewritten by compactions, so the
            // old state's disk is free before the new one is written; what is left (the
            // memtable, files straddling the range) is covered by the range tombstone.
            // Safe only because no reader holds a snapshot (the gate is closed).
            db.delete_file_in_range_cf(live, &[][..], &KEY_SPACE_END[..])?;
            db.delete_range_cf(live, &[][..], &KEY_SPACE_END[..])?;
            let mut batch = WriteBatch::default();
            for item in source.iterator_cf(from, IteratorMode::Start) {
                let (k, v) = item?;
                batch.put_cf(live, k, v);
                if batch.size_in_bytes() >= INSTALL_BATCH_BYTES {
                    db.write(std::mem::take(&mut batch))?;
                }
            }
            db.write(batch)?;
        }
        db.flush_wal(true)?;
        Ok(())
    }
}

pub(crate) fn pending_install_of(db: &DB) -> Result<Option<PathBuf>, StoreError> {
    Ok(db
        .get(INSTALL_PENDING)?
        .map(|bytes| PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())))
}

/// Removes the Raft log's column families from checkpoint `dir` (an independent copy of
/// the database: its files are hard links, so the live database is not touched).
fn drop_raft_column_families(dir: &Path) -> Result<(), StoreError> {
    let mut opts = Options::default();
    opts.set_disable_auto_compactions(true);
    let mut checkpoint = DB::open_cf(&opts, dir, ALL_CFS)?;
    for name in [CF_RAFT_LOG, CF_RAFT_META] {
        checkpoint.drop_cf(name)?;
    }
    Ok(())
}

/// Packs the regular files of `dir` into one file at `out`.
pub fn pack_dir(dir: &Path, out: &Path) -> Result<(), StoreError> {
    let ctx = |what: &str, p: &Path| format!("failed to {what} {}", p.display());
    let mut w =
        BufWriter::new(File::create(out).map_err(|e| StoreError::io(ctx("create", out), e))?);
    w.write_all(PACK_MAGIC)
        .map_err(|e| StoreError::io(ctx("write", out), e))?;
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(|e| StoreError::io(ctx("list", dir), e))?
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::io(ctx("list", dir), e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let len = entry
            .metadata()
            .map_err(|e| StoreError::io(ctx("stat", &path), e))?
            .len();
        w.write_all(&(name.len() as u32).to_be_bytes())
            .and_then(|_| w.write_all(name.as_bytes()))
            .and_then(|_| w.write_all(&len.to_be_bytes()))
            .map_err(|e| StoreError::io(ctx("write", out), e))?;
        let mut f = File::open(&path).map_err(|e| StoreError::io(ctx("open", &path), e))?;
        let copied =
            std::io::copy(&mut f, &mut w).map_err(|e| StoreError::io(ctx("copy", &path), e))?;
        if copied != len {
            return Err(StoreError::io(
                ctx("copy", &path),
                std::io::Error::other("file changed while packing"),
            ));
        }
    }
    w.write_all(&0u32.to_be_bytes())
        .and_then(|_| w.flush())
        .and_then(|_| w.get_ref().sync_all())
        .map_err(|e| StoreError::io(ctx("finish", out), e))?;
    Ok(())
}

/// Reads the next file header of a pack: `None` at the end marker.
fn next_header(r: &mut impl Read, source: &str) -> Result<Option<(String, u64)>, StoreError> {
    let corrupt = |what: &str| StoreError::corrupt("snapshot", what);
    let read = |e| StoreError::io(format!("failed to read {source}"), e);
    let mut len4 = [0u8; 4];
    r.read_exact(&mut len4).map_err(read)?;
    let name_len = u32::from_be_bytes(len4) as usize;
    if name_len == 0 {
        return Ok(None);
    }
    if name_len > 4096 {
        return Err(corrupt("file name too long"));
    }
    let mut name = vec![0u8; name_len];
    r.read_exact(&mut name).map_err(read)?;
    let name = String::from_utf8(name).map_err(|_| corrupt("file name is not UTF-8"))?;
    if name.contains(['/', '\\', '\0']) || name == ".." || name == "." {
        return Err(corrupt("file name escapes the snapshot directory"));
    }
    let mut len8 = [0u8; 8];
    r.read_exact(&mut len8).map_err(read)?;
    Ok(Some((name, u64::from_be_bytes(len8))))
}

fn check_magic(r: &mut impl Read, source: &str) -> Result<(), StoreError> {
    let mut magic = vec![0u8; PACK_MAGIC.len()];
    r.read_exact(&mut magic)
        .map_err(|e| StoreError::io(format!("failed to read {source}"), e))?;
    if magic != PACK_MAGIC {
        return Err(StoreError::corrupt("snapshot", "not a Cairn snapshot"));
    }
    Ok(())
}

/// The bytes the files of a pack take once unpacked, read from its headers alone (the
/// contents are skipped, not read). Fails, like unpacking would, on a malformed pack.
/// Leaves `r` at the end of the pack.
pub fn packed_size(r: &mut (impl Read + Seek), source: &str) -> Result<u64, StoreError> {
    let seek = |e| StoreError::io(format!("failed to seek in {source}"), e);
    let end = r.seek(SeekFrom::End(0)).map_err(seek)?;
    r.seek(SeekFrom::Start(0)).map_err(seek)?;
    let mut r = BufReader::new(r);
    check_magic(&mut r, source)?;
    let mut total = 0u64;
    while let Some((_, len)) = next_header(&mut r, source)? {
        let skip =
            i64::try_from(len).map_err(|_| StoreError::corrupt("snapshot", "truncated file"))?;
        r.seek_relative(skip).map_err(seek)?;
        if r.stream_position().map_err(seek)? > end {
            return Err(StoreError::corrupt("snapshot", "truncated file"));
        }
        total = total.saturating_add(len);
    }
    Ok(total)
}

/// Unpacks a pack read from `r` into `dir` (created), every file and the directory
/// synced before it returns: what a crash leaves behind is either complete or not named
/// anywhere yet.
pub fn unpack_from(r: impl Read, dir: &Path, source: &str) -> Result<(), StoreError> {
    let ctx = |what: &str, p: &Path| format!("failed to {what} {}", p.display());
    fs::create_dir_all(dir).map_err(|e| StoreError::io(ctx("create", dir), e))?;
    let mut r = BufReader::new(r);
    check_magic(&mut r, source)?;
    while let Some((name, len)) = next_header(&mut r, source)? {
        let path = dir.join(&name);
        let mut f = File::create(&path).map_err(|e| StoreError::io(ctx("create", &path), e))?;
        let copied = std::io::copy(&mut (&mut r).take(len), &mut f)
            .map_err(|e| StoreError::io(ctx("write", &path), e))?;
        if copied != len {
            return Err(StoreError::corrupt("snapshot", "truncated file"));
        }
        f.sync_all()
            .map_err(|e| StoreError::io(ctx("sync", &path), e))?;
    }
    sync_dir(dir)
}

/// Unpacks a file made by [`pack_dir`] into `dir` (created); see [`unpack_from`].
pub fn unpack_dir(packed: &Path, dir: &Path) -> Result<(), StoreError> {
    let file = File::open(packed)
        .map_err(|e| StoreError::io(format!("failed to open {}", packed.display()), e))?;
    unpack_from(file, dir, &packed.display().to_string())
}

/// Unpacks the pack in `file` into `dir` after checking that it fits: the unpacked files
/// and `headroom` must be free on `dir`'s filesystem, else nothing is written. (Installing
/// then needs no more: the pack is removed before the live state is rewritten.)
pub fn unpack_into(file: &mut File, dir: &Path, headroom: u64) -> Result<(), StoreError> {
    let source = "the received snapshot";
    let size = packed_size(file, source)?;
    let parent = dir.parent().unwrap_or(dir);
    let stat = rustix::fs::statvfs(parent).map_err(|e| {
        StoreError::io(
            format!("failed to read the free space of {}", parent.display()),
            e.into(),
        )
    })?;
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let needed = size.saturating_add(headroom);
    if free < needed {
        return Err(StoreError::NoSpaceForSnapshot {
            path: parent.to_path_buf(),
            needed,
            free,
        });
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| StoreError::io(format!("failed to seek in {source}"), e))?;
    unpack_from(&mut *file, dir, source)
}

/// Syncs a directory, so the names of the files created in it survive a power loss.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("failed to sync {}", dir.display()), e))
}

/// Replaces `path` with `bytes` so that a power loss leaves the old content or the new,
/// never a torn file: written beside it, synced, renamed over it, the directory synced.
pub fn write_file_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp_name);
    let io = |what: &str, at: &Path| {
        let message = format!("failed to {what} {}", at.display());
        move |e| StoreError::io(message, e)
    };
    let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
    std::io::Write::write_all(&mut file, bytes)
        .and_then(|()| file.sync_all())
        .map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename", &tmp))?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use cairn_core::command::{Append, Command};
    use cairn_core::event::{NewEvent, RawEvent};

    use super::*;
    use crate::{Direction, PageLimit, ReadStart, StoreOptions};

    const BATCH: usize = 500;

    fn append(batch: usize) -> Command {
        Command::Append(Append {
            boundary: "a".into(),
            observations: vec![],
            events: (0..BATCH)
                .map(|i| {
                    let raw = RawEvent {
                        event_id: format!("e{batch}-{i}"),
                        event_type: "T".into(),
                        data: format!("{{\"n\":{i}}}"),
                        metadata: String::new(),
                    };
                    NewEvent::validate(raw, i).expect("valid")
                })
                .collect(),
            at_unix_nanos: 0,
        })
    }

    fn store_with(dir: &Path, batches: usize) -> Store {
        let store = Store::open(dir, &StoreOptions::default()).expect("open");
        let create = Command::CreateBoundary {
            name: "a".into(),
            description: String::new(),
            placement: None,
            existed_before_catalog: false,
            idempotent_event_ids: false,
            if_absent: false,
        };
        store
            .apply(&create, b"0")
            .expect("create")
            .expect("created");
        for batch in 0..batches {
            let marker = format!("{}", batch + 1);
            store
                .apply(&append(batch), marker.as_bytes())
                .expect("append")
                .expect("appended");
        }
        store
    }

    /// Hole 2 of the replication review: an install rewrote the state in place, so a
    /// read in the middle saw a state that never existed (no events, or some) and a
    /// subscription's cursor went back to 0 or jumped ahead.
    #[test]
    fn a_read_during_an_install_sees_the_state_before_or_after_it_and_nothing_between() {
        let tmp = tempfile::tempdir().expect("dir");
        let ahead = store_with(&tmp.path().join("ahead"), 40);
        let checkpoint = tmp.path().join("checkpoint");
        ahead.create_checkpoint(&checkpoint).expect("checkpoint");
        drop(ahead);
        let lagging = store_with(&tmp.path().join("lagging"), 1);
        let bid = lagging
            .with_catalog(|c| c.active_boundary("a").map(|b| b.id))
            .expect("boundary");
        let (before, after) = (BATCH, 40 * BATCH);

        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|reader| {
                let (store, done) = (lagging.clone(), done.clone());
                std::thread::spawn(move || {
                    let query = Default::default();
                    // A subscription's loop: pages from a cursor, each event exactly once
                    // and in order, whatever happens underneath.
                    let mut cursor = 0u64;
                    let mut next_expected = 0i64;
                    let mut reads = 0u64;
                    while !done.load(Ordering::Acquire) || cursor < after as u64 {
                        if reader == 0 {
                            let all = store
                                .read_events(
                                    bid,
                                    &query,
                                    ReadStart::Edge,
                                    Direction::Asc,
                                    PageLimit::events(after + 1),
                                )
                                .expect("read");
                            assert!(
                                all.len() == before || all.len() == after,
                                "a read saw {} events: neither the state before the install \
                                 ({before}) nor after it ({after})",
                                all.len()
                            );
                        }
                        let (page, next) = store
                            .read_page(
                                bid,
                                &query,
                                ReadStart::Prepare(cursor),
                                PageLimit::events(BATCH / 2),
                            )
                            .expect("page");
                        for event in &page {
                            assert_eq!(
                                event.position.prepare, next_expected,
                                "a subscription got a gap or a repeat"
                            );
                            next_expected += 1;
                        }
                        assert!(
                            next >= cursor,
                            "the cursor went back from {cursor} to {next}"
                        );
                        cursor = next;
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        // Let the readers reach the lagging head first.
        std::thread::sleep(std::time::Duration::from_millis(50));
        lagging.install_checkpoint(&checkpoint).expect("install");
        done.store(true, Ordering::Release);
        for reader in readers {
            let reads = reader.join().expect("reader");
            assert!(reads > 0);
        }
        assert_eq!(lagging.event_count(bid), after as u64);
        assert_eq!(lagging.pending_install().expect("marker"), None);
    }

    #[test]
    fn an_install_that_fails_halfway_refuses_reads_until_it_is_resumed() {
        let tmp = tempfile::tempdir().expect("dir");
        let ahead = store_with(&tmp.path().join("ahead"), 3);
        let checkpoint = tmp.path().join("checkpoint");
        ahead.create_checkpoint(&checkpoint).expect("checkpoint");
        drop(ahead);
        let lagging = store_with(&tmp.path().join("lagging"), 1);
        let bid = lagging
            .with_catalog(|c| c.active_boundary("a").map(|b| b.id))
            .expect("boundary");
        // A checkpoint that vanished under the install (a disk fault) fails it after the
        // marker is written.
        let gone = tmp.path().join("gone");
        let err = lagging
            .install_checkpoint(&gone)
            .expect_err("no checkpoint there");
        let read = lagging.read_events(
            bid,
            &Default::default(),
            ReadStart::Edge,
            Direction::Asc,
            PageLimit::events(10),
        );
        let Err(refused) = read else {
            panic!("a read of a half-replaced state after {err}: {read:?}")
        };
        assert!(
            matches!(refused, StoreError::InstallIncomplete(_)),
            "{refused}"
        );
        // Clients see a retryable status: another node can answer.
        assert!(matches!(
            cairn_core::Error::from(refused),
            cairn_core::Error::Unavailable(_)
        ));
        let path = lagging.path().to_path_buf();
        drop(lagging);
        // A restart (the store alone) keeps refusing until the install is resumed.
        let reopened = Store::open(&path, &StoreOptions::default()).expect("reopen");
        assert!(matches!(
            reopened.query_position(bid, &Default::default()),
            Err(StoreError::InstallIncomplete(_))
        ));
        std::fs::rename(&checkpoint, &gone).expect("the checkpoint is back");
        assert_eq!(reopened.resume_install().expect("resume"), Some(gone));
        assert_eq!(reopened.event_count(bid), 3 * BATCH as u64);
        let events = reopened
            .read_events(
                bid,
                &Default::default(),
                ReadStart::Edge,
                Direction::Asc,
                PageLimit::events(10 * BATCH),
            )
            .expect("readable again");
        assert_eq!(events.len(), 3 * BATCH);
    }

    #[test]
    fn a_pack_that_does_not_fit_is_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().expect("dir");
        let ahead = store_with(&tmp.path().join("ahead"), 2);
        let checkpoint = tmp.path().join("checkpoint");
        ahead.create_checkpoint(&checkpoint).expect("checkpoint");
        let pack = tmp.path().join("snapshot.pack");
        pack_dir(&checkpoint, &pack).expect("pack");
        let mut file = File::open(&pack).expect("open");
        let size = packed_size(&mut file, "pack").expect("size");
        let on_disk: u64 = fs::read_dir(&checkpoint)
            .expect("list")
            .map(|e| e.expect("entry").metadata().expect("stat").len())
            .sum();
        assert_eq!(size, on_disk);
        let staged = tmp.path().join("staged");
        let err = unpack_into(&mut file, &staged, u64::MAX / 2).expect_err("cannot fit");
        assert!(
            matches!(err, StoreError::NoSpaceForSnapshot { needed, .. } if needed > size),
            "{err}"
        );
        assert!(err.to_string().contains("nothing was changed"), "{err}");
        assert!(!staged.exists());
        unpack_into(&mut file, &staged, 0).expect("fits");
        let names = |d: &Path| {
            let mut n: Vec<_> = fs::read_dir(d)
                .expect("list")
                .map(|e| e.expect("entry").file_name())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&staged), names(&checkpoint));
        // A truncated pack is refused by its headers alone.
        let bytes = fs::read(&pack).expect("read");
        fs::write(&pack, &bytes[..bytes.len() / 2]).expect("truncate");
        let mut file = File::open(&pack).expect("open");
        assert!(packed_size(&mut file, "pack").is_err());
    }
}
