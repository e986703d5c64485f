//! State-machine snapshots for Raft: a RocksDB checkpoint (hard links, cheap to take) and a
//! single-file packing of it for transfer to another node.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
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
    /// catalog. The Raft log column families are left alone. Crash-safe: see
    /// [`Store::resume_install`].
    pub fn install_checkpoint(&self, dir: &Path) -> Result<(), StoreError> {
        let _writer = self.lock_writer();
        let db = &self.inner.db;
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        let path = dir.to_string_lossy();
        db.put_opt(INSTALL_PENDING, path.as_bytes(), &sync)?;
        self.copy_state_machine(dir)?;
        db.delete_opt(INSTALL_PENDING, &sync)?;
        let catalog = Catalog::load(db)?;
        self.with_catalog_mut(|c| *c = catalog);
        Ok(())
    }

    /// The checkpoint an interrupted installation was copying, if one was: the state
    /// machine is half replaced until [`Store::resume_install`] finishes it.
    pub fn pending_install(&self) -> Result<Option<PathBuf>, StoreError> {
        Ok(self
            .inner
            .db
            .get(INSTALL_PENDING)?
            .map(|bytes| PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())))
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

/// Unpacks a file made by [`pack_dir`] into `dir` (created).
pub fn unpack_dir(packed: &Path, dir: &Path) -> Result<(), StoreError> {
    let ctx = |what: &str, p: &Path| format!("failed to {what} {}", p.display());
    let corrupt = |what: &str| StoreError::corrupt("snapshot", what);
    fs::create_dir_all(dir).map_err(|e| StoreError::io(ctx("create", dir), e))?;
    let mut r =
        BufReader::new(File::open(packed).map_err(|e| StoreError::io(ctx("open", packed), e))?);
    let mut magic = vec![0u8; PACK_MAGIC.len()];
    r.read_exact(&mut magic)
        .map_err(|e| StoreError::io(ctx("read", packed), e))?;
    if magic != PACK_MAGIC {
        return Err(corrupt("not a Cairn snapshot"));
    }
    loop {
        let mut len4 = [0u8; 4];
        r.read_exact(&mut len4)
            .map_err(|e| StoreError::io(ctx("read", packed), e))?;
        let name_len = u32::from_be_bytes(len4) as usize;
        if name_len == 0 {
            return Ok(());
        }
        if name_len > 4096 {
            return Err(corrupt("file name too long"));
        }
        let mut name = vec![0u8; name_len];
        r.read_exact(&mut name)
            .map_err(|e| StoreError::io(ctx("read", packed), e))?;
        let name = String::from_utf8(name).map_err(|_| corrupt("file name is not UTF-8"))?;
        if name.contains('/') || name.contains('\\') || name == ".." || name == "." {
            return Err(corrupt("file name escapes the snapshot directory"));
        }
        let mut len8 = [0u8; 8];
        r.read_exact(&mut len8)
            .map_err(|e| StoreError::io(ctx("read", packed), e))?;
        let len = u64::from_be_bytes(len8);
        let path = dir.join(&name);
        let mut f = File::create(&path).map_err(|e| StoreError::io(ctx("create", &path), e))?;
        let copied = std::io::copy(&mut (&mut r).take(len), &mut f)
            .map_err(|e| StoreError::io(ctx("write", &path), e))?;
        if copied != len {
            return Err(corrupt("truncated file"));
        }
    }
}
