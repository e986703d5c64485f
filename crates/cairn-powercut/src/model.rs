//! The disk's contents, in memory, with what a power cut would take back.
//!
//! The model is POSIX's promise, strictly: a file's bytes are durable once the file was
//! fsynced, a directory entry (a create, an unlink, a rename, a link) once its directory
//! was fsynced. A power cut returns every file to the bytes it had at its last fsync and
//! undoes, newest first, every directory change not yet synced. Changes are undone as a
//! journal suffix — an fsync of a directory makes every change before its latest one
//! durable too, as a journaling filesystem does — so the state after a cut is one the
//! disk really passed through, never a mix no filesystem would produce.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// An errno for the kernel.
pub type Errno = libc::c_int;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// What `stat` shows of an inode.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// What a power cut took back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files whose unsynced bytes were dropped or overwrites undone.
    pub files_reverted: usize,
    /// Bytes written but not synced, dropped.
    pub bytes_lost: u64,
    /// Directory changes (entries added or removed) undone.
    pub entries_undone: usize,
}

#[derive(Debug, Default)]
struct FileData {
    bytes: Vec<u8>,
    /// Length at the last fsync.
    synced_len: usize,
    /// Bytes below `synced_len` overwritten or cut off since the last fsync, oldest first:
    /// (offset, what was there). Appends need no entry; truncating back to `synced_len`
    /// removes them.
    undo: Vec<(usize, Vec<u8>)>,
}

impl FileData {
    fn remember(&mut self, from: usize, to: usize) {
        let to = to.min(self.synced_len).min(self.bytes.len());
        if from < to {
            self.undo.push((from, self.bytes[from..to].to_vec()));
        }
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        self.remember(offset, offset + data.len());
        let end = offset + data.len();
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.bytes[offset..end].copy_from_slice(data);
    }

    fn truncate(&mut self, len: usize) {
        self.remember(len, self.bytes.len());
        self.bytes.resize(len, 0);
    }

    fn sync(&mut self) {
        self.synced_len = self.bytes.len();
        self.undo.clear();
    }

    fn dirty(&self) -> bool {
        !self.undo.is_empty() || self.bytes.len() != self.synced_len
    }

    /// Back to the last fsync; returns the bytes lost.
    fn revert(&mut self) -> u64 {
        let mut lost = self.bytes.len().saturating_sub(self.synced_len) as u64;
        while let Some((offset, old)) = self.undo.pop() {
            lost += old.len() as u64;
            let end = offset + old.len();
            if self.bytes.len() < end {
                self.bytes.resize(end, 0);
            }
            self.bytes[offset..end].copy_from_slice(&old);
        }
        self.bytes.resize(self.synced_len, 0);
        lost
    }
}

#[derive(Debug)]
enum Body {
    File(FileData),
    Dir(BTreeMap<OsString, u64>),
}

#[derive(Debug)]
struct Inode {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    /// Directory entries naming it.
    links: u32,
    /// Open handles on it.
    open: u32,
    mtime: SystemTime,
    ctime: SystemTime,
}

/// One directory change: an entry added or removed.
#[derive(Debug, Clone)]
enum Step {
    Added { dir: u64, name: OsString, ino: u64 },
    Removed { dir: u64, name: OsString, ino: u64 },
}

/// Steps that happen together (a rename is up to three), and the directories they touch.
#[derive(Debug)]
struct Change {
    dirs: Vec<u64>,
    steps: Vec<Step>,
}

/// The disk.
#[derive(Debug)]
pub struct Fs {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// Open handles: handle → inode. A power cut closes them all, so a request a killed
    /// process still had in flight cannot write after the power came back.
    handles: HashMap<u64, u64>,
    next_fh: u64,
    /// Directory changes not yet durable, oldest first.
    journal: Vec<Change>,
    /// Size the disk reports (statfs).
    capacity: u64,
}

fn now() -> SystemTime {
    SystemTime::now()
}

impl Fs {
    /// An empty disk of `capacity` bytes, its root owned by `uid`:`gid`.
    pub fn new(capacity: u64, uid: u32, gid: u32) -> Fs {
        let root = Inode {
            body: Body::Dir(BTreeMap::new()),
            perm: 0o755,
            uid,
            gid,
            links: 1,
            open: 0,
            mtime: now(),
            ctime: now(),
        };
        Fs {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            journal: Vec::new(),
            capacity,
        }
    }

    fn inode(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.inode(dir)?.body {
            Body::Dir(entries) => Ok(entries),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match &mut self.inode_mut(dir)?.body {
            Body::Dir(entries) => Ok(entries),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match &mut self.inode_mut(ino)?.body {
            Body::File(data) => Ok(data),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    pub fn attr(&self, ino: u64) -> Result<Attr, Errno> {
        let inode = self.inode(ino)?;
        let (kind, size) = match &inode.body {
            Body::File(data) => (Kind::File, data.bytes.len() as u64),
            Body::Dir(entries) => (Kind::Dir, entries.len() as u64),
        };
        Ok(Attr {
            ino,
            kind,
            size,
            perm: inode.perm,
            nlink: inode.links,
            uid: inode.uid,
            gid: inode.gid,
            mtime: inode.mtime,
            ctime: inode.ctime,
        })
    }

    pub fn lookup(&self, dir: u64, name: &OsStr) -> Result<Attr, Errno> {
        let ino = *self.entries(dir)?.get(name).ok_or(libc::ENOENT)?;
        self.attr(ino)
    }

    /// Applies steps now and journals them until their directories are synced.
    fn change(&mut self, steps: Vec<Step>) {
        let mut dirs = Vec::new();
        for step in &steps {
            self.apply(step, false);
            let dir = match step {
                Step::Added { dir, .. } | Step::Removed { dir, .. } => *dir,
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        self.journal.push(Change { dirs, steps });
    }

    /// Does (or, with `undo`, takes back) one step. Steps are only ever applied to the
    /// state they were recorded against, so the lookups cannot fail.
    fn apply(&mut self, step: &Step, undo: bool) {
        let (dir, name, ino, adds) = match step {
            Step::Added { dir, name, ino } => (*dir, name, *ino, !undo),
            Step::Removed { dir, name, ino } => (*dir, name, *ino, undo),
        };
        if let Ok(entries) = self.entries_mut(dir) {
            if adds {
                entries.insert(name.clone(), ino);
            } else {
                entries.remove(name);
            }
        }
        let time = now();
        if let Some(parent) = self.inodes.get_mut(&dir) {
            parent.mtime = time;
        }
        if let Some(inode) = self.inodes.get_mut(&ino) {
            if adds {
                inode.links += 1;
            } else {
                inode.links = inode.links.saturating_sub(1);
            }
            inode.ctime = time;
        }
    }

    fn fresh(&mut self, body: Body, perm: u16, uid: u32, gid: u32) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        let time = now();
        self.inodes.insert(
            ino,
            Inode {
                body,
                perm,
                uid,
                gid,
                links: 0,
                open: 0,
                mtime: time,
                ctime: time,
            },
        );
        ino
    }

    fn vacant(&self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        if self.entries(dir)?.contains_key(name) {
            Err(libc::EEXIST)
        } else {
            Ok(())
        }
    }

    pub fn mkdir(
        &mut self,
        dir: u64,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, Errno> {
        self.vacant(dir, name)?;
        let ino = self.fresh(Body::Dir(BTreeMap::new()), perm, uid, gid);
        self.change(vec![Step::Added {
            dir,
            name: name.to_owned(),
            ino,
        }]);
        self.attr(ino)
    }

    /// Creates a file and opens it; `exclusive` is O_EXCL. An existing file is opened.
    pub fn create(
        &mut self,
        dir: u64,
        name: &OsStr,
        perm: u16,
        exclusive: bool,
        owner: (u32, u32),
    ) -> Result<(Attr, u64), Errno> {
        if let Some(&ino) = self.entries(dir)?.get(name) {
            if exclusive {
                return Err(libc::EEXIST);
            }
            let fh = self.open(ino)?;
            return Ok((self.attr(ino)?, fh));
        }
        let ino = self.fresh(Body::File(FileData::default()), perm, owner.0, owner.1);
        self.change(vec![Step::Added {
            dir,
            name: name.to_owned(),
            ino,
        }]);
        let fh = self.open(ino)?;
        Ok((self.attr(ino)?, fh))
    }

    pub fn open(&mut self, ino: u64) -> Result<u64, Errno> {
        self.inode_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    /// A handle opened before the last power cut is gone.
    fn handle(&self, fh: u64, ino: u64) -> Result<(), Errno> {
        match self.handles.get(&fh) {
            Some(&open) if open == ino => Ok(()),
            _ => Err(libc::EBADF),
        }
    }

    pub fn release(&mut self, fh: u64) {
        if let Some(ino) = self.handles.remove(&fh) {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.open = inode.open.saturating_sub(1);
            }
            self.collect();
        }
    }

    pub fn read(&self, fh: u64, ino: u64, offset: u64, size: u32) -> Result<&[u8], Errno> {
        self.handle(fh, ino)?;
        match &self.inode(ino)?.body {
            Body::File(data) => {
                let start = (offset as usize).min(data.bytes.len());
                let end = start.saturating_add(size as usize).min(data.bytes.len());
                Ok(&data.bytes[start..end])
            }
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    pub fn write(&mut self, fh: u64, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        self.handle(fh, ino)?;
        let offset = usize::try_from(offset).map_err(|_| libc::EFBIG)?;
        let used = self.used();
        let grows = (offset + data.len()).saturating_sub(self.file_mut(ino)?.bytes.len());
        if used + grows as u64 > self.capacity {
            return Err(libc::ENOSPC);
        }
        self.file_mut(ino)?.write(offset, data);
        self.inode_mut(ino)?.mtime = now();
        u32::try_from(data.len()).map_err(|_| libc::EINVAL)
    }

    /// chmod and truncate; times are taken as given (not modelled).
    pub fn setattr(
        &mut self,
        ino: u64,
        perm: Option<u16>,
        size: Option<u64>,
    ) -> Result<Attr, Errno> {
        if let Some(size) = size {
            let size = usize::try_from(size).map_err(|_| libc::EFBIG)?;
            self.file_mut(ino)?.truncate(size);
            self.inode_mut(ino)?.mtime = now();
        }
        if let Some(perm) = perm {
            self.inode_mut(ino)?.perm = perm;
        }
        self.attr(ino)
    }

    /// `fallocate`: reserving space is all RocksDB asks (KEEP_SIZE); a plain call extends.
    pub fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            let end = usize::try_from(offset.saturating_add(len)).map_err(|_| libc::EFBIG)?;
            let file = self.file_mut(ino)?;
            if file.bytes.len() < end {
                file.bytes.resize(end, 0);
            }
        }
        Ok(())
    }

    pub fn unlink(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.entries(dir)?.get(name).ok_or(libc::ENOENT)?;
        if self.attr(ino)?.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        self.change(vec![Step::Removed {
            dir,
            name: name.to_owned(),
            ino,
        }]);
        Ok(())
    }

    pub fn rmdir(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.entries(dir)?.get(name).ok_or(libc::ENOENT)?;
        if !self.entries(ino)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.change(vec![Step::Removed {
            dir,
            name: name.to_owned(),
            ino,
        }]);
        Ok(())
    }

    /// `flags` may be RENAME_NOREPLACE; RENAME_EXCHANGE is not supported.
    pub fn rename(
        &mut self,
        dir: u64,
        name: &OsStr,
        new_dir: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(libc::EINVAL);
        }
        let ino = *self.entries(dir)?.get(name).ok_or(libc::ENOENT)?;
        let kind = self.attr(ino)?.kind;
        let mut steps = vec![Step::Removed {
            dir,
            name: name.to_owned(),
            ino,
        }];
        if let Some(&old) = self.entries(new_dir)?.get(new_name) {
            if old == ino {
                return Ok(());
            }
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            match (kind, self.attr(old)?.kind) {
                (Kind::File, Kind::Dir) => return Err(libc::EISDIR),
                (Kind::Dir, Kind::File) => return Err(libc::ENOTDIR),
                (Kind::Dir, Kind::Dir) if !self.entries(old)?.is_empty() => {
                    return Err(libc::ENOTEMPTY);
                }
                _ => {}
            }
            steps.push(Step::Removed {
                dir: new_dir,
                name: new_name.to_owned(),
                ino: old,
            });
        }
        if kind == Kind::Dir && self.is_within(new_dir, ino) {
            return Err(libc::EINVAL);
        }
        steps.push(Step::Added {
            dir: new_dir,
            name: new_name.to_owned(),
            ino,
        });
        self.change(steps);
        Ok(())
    }

    /// Whether `dir` is `ancestor` or below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> bool {
        if dir == ancestor {
            return true;
        }
        match self.inodes.get(&ancestor).map(|i| &i.body) {
            Some(Body::Dir(entries)) => entries.values().any(|&child| {
                matches!(self.inodes.get(&child).map(|i| &i.body), Some(Body::Dir(_)))
                    && self.is_within(dir, child)
            }),
            _ => false,
        }
    }

    pub fn link(&mut self, ino: u64, dir: u64, name: &OsStr) -> Result<Attr, Errno> {
        if self.attr(ino)?.kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        self.vacant(dir, name)?;
        self.change(vec![Step::Added {
            dir,
            name: name.to_owned(),
            ino,
        }]);
        self.attr(ino)
    }

    pub fn readdir(&self, dir: u64) -> Result<Vec<(u64, Kind, OsString)>, Errno> {
        let mut out = vec![
            (dir, Kind::Dir, OsString::from(".")),
            (dir, Kind::Dir, OsString::from("..")),
        ];
        for (name, &ino) in self.entries(dir)? {
            out.push((ino, self.attr(ino)?.kind, name.clone()));
        }
        Ok(out)
    }

    /// fsync / fdatasync of a file: its bytes are durable.
    pub fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        self.file_mut(ino)?.sync();
        Ok(())
    }

    /// fsync of a directory: its entries are durable, and every change journaled before
    /// its latest one.
    pub fn fsyncdir(&mut self, dir: u64) -> Result<(), Errno> {
        self.entries(dir)?;
        if let Some(last) = self.journal.iter().rposition(|c| c.dirs.contains(&dir)) {
            self.journal.drain(..=last);
            self.collect();
        }
        Ok(())
    }

    /// Bytes held by files.
    pub fn used(&self) -> u64 {
        self.inodes
            .values()
            .map(|i| match &i.body {
                Body::File(data) => data.bytes.len() as u64,
                Body::Dir(_) => 0,
            })
            .sum()
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Frees inodes no entry names, no handle holds and no pending change could bring back.
    fn collect(&mut self) {
        let pending: Vec<u64> = self
            .journal
            .iter()
            .flat_map(|c| c.steps.iter())
            .map(|s| match s {
                Step::Added { ino, .. } | Step::Removed { ino, .. } => *ino,
            })
            .collect();
        self.inodes
            .retain(|ino, i| *ino == ROOT || i.links > 0 || i.open > 0 || pending.contains(ino));
    }

    /// The power goes out: every handle closes, unsynced directory changes are undone
    /// newest first, every file goes back to its last fsync.
    pub fn power_cut(&mut self) -> CutReport {
        let mut report = CutReport::default();
        for (_, ino) in self.handles.drain() {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.open = 0;
            }
        }
        while let Some(change) = self.journal.pop() {
            for step in change.steps.iter().rev() {
                self.apply(step, true);
                report.entries_undone += 1;
            }
        }
        for inode in self.inodes.values_mut() {
            if let Body::File(data) = &mut inode.body
                && data.dirty()
            {
                report.files_reverted += 1;
                report.bytes_lost += data.revert();
            }
        }
        self.collect();
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: (u32, u32) = (0, 0);

    fn disk() -> Fs {
        Fs::new(1 << 30, 0, 0)
    }

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    /// Creates `dir/name` holding `bytes`, synced or not, and closes it.
    fn file(fs: &mut Fs, dir: u64, n: &str, bytes: &[u8], sync: bool) -> u64 {
        let (attr, fh) = fs.create(dir, name(n), 0o644, true, OWNER).expect("create");
        fs.write(fh, attr.ino, 0, bytes).expect("write");
        if sync {
            fs.fsync(attr.ino).expect("fsync");
        }
        fs.release(fh);
        attr.ino
    }

    fn contents(fs: &mut Fs, dir: u64, n: &str) -> Option<Vec<u8>> {
        let attr = fs.lookup(dir, name(n)).ok()?;
        let fh = fs.open(attr.ino).expect("open");
        let bytes = fs.read(fh, attr.ino, 0, u32::MAX).expect("read").to_vec();
        fs.release(fh);
        Some(bytes)
    }

    #[test]
    fn a_synced_file_in_a_synced_directory_survives_and_its_unsynced_tail_does_not() {
        let mut fs = disk();
        let ino = file(&mut fs, ROOT, "wal", b"acknowledged", true);
        fs.fsyncdir(ROOT).expect("fsync dir");
        let fh = fs.open(ino).expect("open");
        fs.write(fh, ino, 12, b" and more").expect("append");
        fs.release(fh);
        let report = fs.power_cut();
        assert_eq!(
            contents(&mut fs, ROOT, "wal").as_deref(),
            Some(&b"acknowledged"[..])
        );
        assert_eq!(report.bytes_lost, 9);
        assert_eq!(report.files_reverted, 1);
    }

    #[test]
    fn a_file_whose_directory_was_not_synced_vanishes_even_if_the_file_was() {
        let mut fs = disk();
        file(&mut fs, ROOT, "marker", b"x", true);
        let report = fs.power_cut();
        assert_eq!(contents(&mut fs, ROOT, "marker"), None);
        assert_eq!(report.entries_undone, 1);
        assert_eq!(fs.used(), 0, "its bytes are freed");
    }

    #[test]
    fn an_overwrite_and_a_truncation_since_the_last_fsync_are_undone() {
        let mut fs = disk();
        let ino = file(&mut fs, ROOT, "f", b"0123456789", true);
        fs.fsyncdir(ROOT).expect("fsync dir");
        let fh = fs.open(ino).expect("open");
        fs.write(fh, ino, 2, b"ab").expect("overwrite");
        fs.setattr(ino, None, Some(4)).expect("truncate");
        fs.write(fh, ino, 8, b"zz").expect("write past a hole");
        fs.release(fh);
        assert_eq!(
            contents(&mut fs, ROOT, "f").as_deref(),
            Some(&b"01ab\0\0\0\0zz"[..])
        );
        fs.power_cut();
        assert_eq!(
            contents(&mut fs, ROOT, "f").as_deref(),
            Some(&b"0123456789"[..])
        );
    }

    #[test]
    fn an_unsynced_rename_over_a_file_is_undone_whole() {
        let mut fs = disk();
        file(&mut fs, ROOT, "CURRENT", b"old", true);
        fs.fsyncdir(ROOT).expect("fsync dir");
        file(&mut fs, ROOT, "CURRENT.tmp", b"new", true);
        fs.rename(ROOT, name("CURRENT.tmp"), ROOT, name("CURRENT"), 0)
            .expect("rename");
        assert_eq!(
            contents(&mut fs, ROOT, "CURRENT").as_deref(),
            Some(&b"new"[..])
        );
        fs.power_cut();
        assert_eq!(
            contents(&mut fs, ROOT, "CURRENT").as_deref(),
            Some(&b"old"[..])
        );
        assert_eq!(contents(&mut fs, ROOT, "CURRENT.tmp"), None);
    }

    #[test]
    fn a_synced_rename_survives() {
        let mut fs = disk();
        file(&mut fs, ROOT, "CURRENT", b"old", true);
        file(&mut fs, ROOT, "CURRENT.tmp", b"new", true);
        fs.rename(ROOT, name("CURRENT.tmp"), ROOT, name("CURRENT"), 0)
            .expect("rename");
        fs.fsyncdir(ROOT).expect("fsync dir");
        fs.power_cut();
        assert_eq!(
            contents(&mut fs, ROOT, "CURRENT").as_deref(),
            Some(&b"new"[..])
        );
    }

    #[test]
    fn an_unsynced_unlink_brings_the_file_back_and_a_synced_one_frees_it() {
        let mut fs = disk();
        file(&mut fs, ROOT, "sst", b"table", true);
        fs.fsyncdir(ROOT).expect("fsync dir");
        fs.unlink(ROOT, name("sst")).expect("unlink");
        fs.power_cut();
        assert_eq!(
            contents(&mut fs, ROOT, "sst").as_deref(),
            Some(&b"table"[..])
        );
        fs.unlink(ROOT, name("sst")).expect("unlink");
        fs.fsyncdir(ROOT).expect("fsync dir");
        assert_eq!(fs.used(), 0);
        fs.power_cut();
        assert_eq!(contents(&mut fs, ROOT, "sst"), None);
    }

    #[test]
    fn syncing_a_directory_makes_earlier_changes_elsewhere_durable_too() {
        let mut fs = disk();
        let a = fs.mkdir(ROOT, name("a"), 0o755, 0, 0).expect("mkdir").ino;
        let b = fs.mkdir(ROOT, name("b"), 0o755, 0, 0).expect("mkdir").ino;
        file(&mut fs, a, "early", b"1", true);
        file(&mut fs, b, "synced", b"2", true);
        file(&mut fs, a, "late", b"3", true);
        fs.fsyncdir(b).expect("fsync b");
        fs.power_cut();
        assert!(contents(&mut fs, a, "early").is_some(), "before b's change");
        assert!(contents(&mut fs, b, "synced").is_some());
        assert!(contents(&mut fs, a, "late").is_none(), "after b's change");
    }

    #[test]
    fn a_hard_link_shares_bytes_and_an_unsynced_one_is_undone() {
        let mut fs = disk();
        let ino = file(&mut fs, ROOT, "000012.sst", b"table", true);
        fs.fsyncdir(ROOT).expect("fsync dir");
        let dir = fs
            .mkdir(ROOT, name("checkpoint"), 0o755, 0, 0)
            .expect("mkdir")
            .ino;
        fs.link(ino, dir, name("000012.sst")).expect("link");
        assert_eq!(fs.attr(ino).expect("attr").nlink, 2);
        assert_eq!(
            contents(&mut fs, dir, "000012.sst").as_deref(),
            Some(&b"table"[..])
        );
        fs.power_cut();
        assert!(fs.lookup(ROOT, name("checkpoint")).is_err());
        assert_eq!(fs.attr(ino).expect("attr").nlink, 1);
    }

    #[test]
    fn a_handle_from_before_the_cut_writes_nothing_after_it() {
        let mut fs = disk();
        let (attr, fh) = fs
            .create(ROOT, name("log"), 0o644, true, OWNER)
            .expect("create");
        fs.fsync(attr.ino).expect("fsync");
        fs.fsyncdir(ROOT).expect("fsync dir");
        fs.power_cut();
        assert_eq!(fs.write(fh, attr.ino, 0, b"late"), Err(libc::EBADF));
        assert_eq!(contents(&mut fs, ROOT, "log").as_deref(), Some(&b""[..]));
    }

    #[test]
    fn a_full_disk_refuses_to_grow() {
        let mut fs = Fs::new(8, 0, 0);
        let (attr, fh) = fs
            .create(ROOT, name("f"), 0o644, true, OWNER)
            .expect("create");
        assert_eq!(fs.write(fh, attr.ino, 0, b"12345678"), Ok(8));
        assert_eq!(fs.write(fh, attr.ino, 8, b"9"), Err(libc::ENOSPC));
        assert_eq!(fs.write(fh, attr.ino, 0, b"overwrite"[..8].as_ref()), Ok(8));
    }

    #[test]
    fn directories_refuse_what_posix_refuses() {
        let mut fs = disk();
        let dir = fs.mkdir(ROOT, name("d"), 0o755, 0, 0).expect("mkdir").ino;
        file(&mut fs, dir, "f", b"", false);
        assert_eq!(fs.rmdir(ROOT, name("d")), Err(libc::ENOTEMPTY));
        assert_eq!(fs.unlink(ROOT, name("d")), Err(libc::EISDIR));
        assert_eq!(
            fs.rename(ROOT, name("d"), dir, name("inside"), 0),
            Err(libc::EINVAL)
        );
        assert_eq!(
            fs.mkdir(ROOT, name("d"), 0o755, 0, 0).map(|a| a.ino),
            Err(libc::EEXIST)
        );
        file(&mut fs, ROOT, "g", b"", false);
        assert_eq!(
            fs.rename(ROOT, name("g"), ROOT, name("d"), libc::RENAME_NOREPLACE),
            Err(libc::EEXIST)
        );
        assert_eq!(
            fs.rename(ROOT, name("g"), ROOT, name("d"), 0),
            Err(libc::EISDIR)
        );
    }
}
