//! A disk whose power can be cut, for tests: a FUSE filesystem held in memory that, on
//! [`Disk::power_cut`], forgets every write and directory change that was not synced —
//! what a machine losing power loses, which SIGKILL (the page cache survives it) never
//! shows. A LazyFS-style layer, since this kernel has no device-mapper for dm-flakey or
//! dm-log-writes.
//!
//! Mounting needs `/dev/fuse` and root (the mount is made with mount(2), no fusermount).
//! Tests that use it are `#[ignore]`d and run with the real-server suites.
//!
//! Cut the power only when nothing has the disk open (kill the processes using it
//! first): a cut closes every handle, and a request still in flight from a killed process
//! is refused rather than written after the power came back.

mod model;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

pub use model::CutReport;
use model::{Attr, Fs, Kind};

/// A disk's default size, as statfs reports it: large enough for any test, small enough
/// that a runaway writer fails with ENOSPC before it takes the machine's memory.
pub const DEFAULT_CAPACITY: u64 = 8 << 30;

/// What went wrong mounting or unmounting.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("failed to mount a power-cut disk at {path} (needs root and /dev/fuse): {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The kernel asks again every time: after a cut nothing it cached is true any more.
const TTL: Duration = Duration::ZERO;

/// Block size statfs and stat report.
const BLOCK: u32 = 4096;

/// A mounted power-cut disk; unmounted when dropped.
pub struct Disk {
    fs: Arc<Mutex<Fs>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl Disk {
    /// Mounts an empty disk of [`DEFAULT_CAPACITY`] at `mountpoint` (an existing directory).
    pub fn mount(mountpoint: &Path) -> Result<Disk, DiskError> {
        Disk::mount_with_capacity(mountpoint, DEFAULT_CAPACITY)
    }

    /// Mounts an empty disk of `capacity` bytes at `mountpoint`.
    pub fn mount_with_capacity(mountpoint: &Path, capacity: u64) -> Result<Disk, DiskError> {
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let fs = Arc::new(Mutex::new(Fs::new(capacity, uid, gid)));
        let options = [
            MountOption::FSName("cairn-powercut".into()),
            MountOption::DefaultPermissions,
        ];
        let session =
            fuser::spawn_mount2(Adapter(fs.clone()), mountpoint, &options).map_err(|source| {
                DiskError::Mount {
                    path: mountpoint.to_owned(),
                    source,
                }
            })?;
        Ok(Disk {
            fs,
            mountpoint: mountpoint.to_owned(),
            session: Some(session),
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The power goes out and comes back: what was not synced is gone.
    pub fn power_cut(&self) -> CutReport {
        lock(&self.fs).power_cut()
    }

    /// Bytes the files on it hold.
    pub fn used(&self) -> u64 {
        lock(&self.fs).used()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Detach first: a process a failing test left behind may still hold files, and a
        // plain unmount would then fail and leave a dead mount in the temp directory.
        let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        drop(self.session.take());
    }
}

/// Answers a request that returns nothing but success or an errno.
fn answer(reply: ReplyEmpty, result: Result<(), model::Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn lock(fs: &Mutex<Fs>) -> MutexGuard<'_, Fs> {
    fs.lock().unwrap_or_else(|p| p.into_inner())
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.mtime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.ctime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: BLOCK,
        flags: 0,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
    }
}

/// Permission bits of a mode as given by the kernel, after the umask.
fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

/// The model behind the kernel's requests.
struct Adapter(Arc<Mutex<Fs>>);

impl Filesystem for Adapter {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match lock(&self.0).lookup(parent, name) {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match lock(&self.0).attr(ino) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        match lock(&self.0).setattr(ino, mode.map(|m| perm(m, 0)), size) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match lock(&self.0).mkdir(parent, name, perm(mode, umask), req.uid(), req.gid()) {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, lock(&self.0).unlink(parent, name));
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, lock(&self.0).rmdir(parent, name));
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        answer(
            reply,
            lock(&self.0).rename(parent, name, newparent, newname, flags),
        );
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        match lock(&self.0).link(ino, newparent, newname) {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), 0),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: every open drops the kernel's cached pages, so a process
        // started after a cut reads what the disk kept.
        match lock(&self.0).open(ino) {
            Ok(fh) => reply.opened(fh, 0),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let exclusive = flags & libc::O_EXCL != 0;
        let created = lock(&self.0).create(
            parent,
            name,
            perm(mode, umask),
            exclusive,
            (req.uid(), req.gid()),
        );
        match created {
            Ok((attr, fh)) => reply.created(&TTL, &file_attr(&attr), 0, fh, 0),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        match lock(&self.0).read(fh, ino, offset, size) {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        match lock(&self.0).write(fh, ino, offset, data) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.0).release(fh);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        answer(reply, lock(&self.0).fsync(ino));
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match lock(&self.0).readdir(ino) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let skip = usize::try_from(offset).unwrap_or(0);
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(skip) {
            // The offset handed back is where the next call resumes.
            if reply.add(child, (i + 1) as i64, file_type(kind), name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        answer(reply, lock(&self.0).fsyncdir(ino));
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let fs = lock(&self.0);
        let blocks = fs.capacity() / u64::from(BLOCK);
        let free = fs.capacity().saturating_sub(fs.used()) / u64::from(BLOCK);
        reply.statfs(blocks, free, free, 1 << 20, 1 << 20, BLOCK, 255, BLOCK);
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (Ok(offset), Ok(length)) = (u64::try_from(offset), u64::try_from(length)) else {
            return reply.error(libc::EINVAL);
        };
        answer(reply, lock(&self.0).fallocate(ino, offset, length, mode));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Through the kernel: std::fs on the mount, a cut, and what a new process would read.
    #[test]
    #[ignore = "needs root and /dev/fuse (run with the real-server suites)"]
    fn through_the_kernel_a_cut_keeps_what_was_synced_and_nothing_else() {
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = Disk::mount(dir.path()).expect("mount");
        let root = disk.path();
        std::fs::create_dir(root.join("db")).expect("mkdir");
        std::fs::File::open(root)
            .and_then(|d| d.sync_all())
            .expect("sync root");
        let mut wal = std::fs::File::create(root.join("db/wal")).expect("create");
        wal.write_all(b"synced;").expect("write");
        wal.sync_data().expect("fdatasync");
        std::fs::File::open(root.join("db"))
            .and_then(|d| d.sync_all())
            .expect("sync db");
        wal.write_all(b"not synced").expect("write");
        std::fs::write(root.join("db/stray"), b"never synced").expect("write stray");
        drop(wal);
        assert_eq!(
            std::fs::read(root.join("db/wal")).expect("read"),
            b"synced;not synced"
        );

        let report = disk.power_cut();
        assert_eq!(
            std::fs::read(root.join("db/wal")).expect("read"),
            b"synced;"
        );
        assert!(
            !root.join("db/stray").exists(),
            "an unsynced create is gone"
        );
        assert_eq!(report.bytes_lost, 10 + 12);
        assert_eq!(report.entries_undone, 1);
        let free = nix::sys::statvfs::statvfs(root).expect("statvfs");
        assert!(free.blocks_available() > 0, "statfs reports free space");
    }
}
