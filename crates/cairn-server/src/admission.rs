//! Admission of writes: what a node takes on before a command waits anywhere (in the
//! proposer, on a forwarding stream, in a leader's forwarded writes). A write refused here
//! was never proposed, so its RESOURCE_EXHAUSTED is a definite "nothing was written".

use std::sync::Arc;

use cairn_core::Error;
use cairn_core::command::Command;

/// The two limits every write passes, on the node its client called and again on the
/// leader it is forwarded to.
#[derive(Debug)]
pub struct Admission {
    /// Bytes of writes held at once.
    pub budget: WriteBudget,
    /// Free space kept on the data directory's filesystem.
    pub floor: DiskFloor,
}

impl Admission {
    /// Takes `command` on, or refuses it (RESOURCE_EXHAUSTED) without side effects. Upkeep
    /// (lease renewals and releases, which free what they hold) passes a full disk.
    pub fn admit(&self, command: &Command) -> Result<WriteReservation, Error> {
        if !command.is_upkeep() {
            self.floor.check()?;
        }
        self.budget.reserve(command.approx_bytes())
    }
}

/// How long a reading of the data directory's free space is trusted.
const FREE_SPACE_TTL_MILLIS: u64 = 100;

/// Refuses writes while the data directory's filesystem has less than a floor of free
/// space, so that RocksDB never meets ENOSPC on this node's own writes (a storage error
/// stops Raft: the node would have to restart). Reads go on. RocksDB's own SstFileManager
/// would do it inside the engine, but the Rust binding does not expose it.
#[derive(Debug)]
pub struct DiskFloor {
    path: std::path::PathBuf,
    floor_bytes: u64,
    /// Milliseconds since `epoch` of the last reading, and the free bytes it found.
    read_at_millis: std::sync::atomic::AtomicU64,
    free_bytes: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

impl DiskFloor {
    /// A floor of `floor_bytes` (0: none) on the filesystem holding `path`.
    pub fn new(path: std::path::PathBuf, floor_bytes: u64) -> Self {
        DiskFloor {
            path,
            floor_bytes,
            read_at_millis: std::sync::atomic::AtomicU64::new(0),
            free_bytes: std::sync::atomic::AtomicU64::new(u64::MAX),
            epoch: std::time::Instant::now(),
        }
    }

    fn free_bytes(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let read_at = self.read_at_millis.load(Relaxed);
        if read_at != 0 && now.saturating_sub(read_at) < FREE_SPACE_TTL_MILLIS {
            return self.free_bytes.load(Relaxed);
        }
        let free = match rustix::fs::statvfs(&self.path) {
            Ok(fs) => fs.f_bavail.saturating_mul(fs.f_frsize),
            Err(e) => {
                // Unknown is not full: RocksDB reports a real ENOSPC itself.
                tracing::warn!(
                    "failed to read the free space of {}: {e}",
                    self.path.display()
                );
                u64::MAX
            }
        };
        self.free_bytes.store(free, Relaxed);
        self.read_at_millis.store(now.max(1), Relaxed);
        free
    }

    /// RESOURCE_EXHAUSTED while the filesystem is below the floor.
    pub fn check(&self) -> Result<(), Error> {
        if self.floor_bytes == 0 {
            return Ok(());
        }
        self.check_room(0)
    }

    /// RESOURCE_EXHAUSTED unless `bytes` more would leave the floor free (without a floor:
    /// unless they fit at all).
    pub fn check_room(&self, bytes: u64) -> Result<(), Error> {
        let free = self.free_bytes();
        if free < self.floor_bytes.saturating_add(bytes) {
            if bytes > 0 {
                return Err(Error::ResourceExhausted(format!(
                    "the data directory's filesystem has {} MiB free; {} MiB more are needed (and {} MiB kept free, --min-free-disk-mb)",
                    free / (1024 * 1024),
                    bytes.div_ceil(1024 * 1024),
                    self.floor_bytes / (1024 * 1024)
                )));
            }
            return Err(Error::ResourceExhausted(format!(
                "the data directory's filesystem has {} MiB free, below the {} MiB this node keeps (--min-free-disk-mb); nothing was written, and writes resume once space is freed",
                free / (1024 * 1024),
                self.floor_bytes / (1024 * 1024)
            )));
        }
        Ok(())
    }
}

/// Bounds the bytes of writes a node holds at once: every queue a write waits in (the
/// proposer's, the forwarding stream's, a leader's forwarded writes) holds a reservation
/// taken before it, so their sum stays below the budget however many clients write.
#[derive(Debug)]
pub struct WriteBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: u32,
}

/// A write's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct WriteReservation {
    _permits: tokio::sync::OwnedSemaphorePermit,
}

impl WriteBudget {
    /// A budget of `bytes` (counted in KiB, rounded up).
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u32);
        WriteBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// Reserves room for a command of about `bytes`, or RESOURCE_EXHAUSTED at once.
    pub fn reserve(&self, bytes: usize) -> Result<WriteReservation, Error> {
        let kib = u32::try_from(bytes.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.total_kib);
        self.kib
            .clone()
            .try_acquire_many_owned(kib)
            .map(|permits| WriteReservation { _permits: permits })
            .map_err(|_| {
                Error::ResourceExhausted(format!(
                    "this node holds {} MiB of writes waiting to commit (--max-write-bytes-in-flight); nothing was written, retry after a pause",
                    self.total_kib / 1024
                ))
            })
    }
}
