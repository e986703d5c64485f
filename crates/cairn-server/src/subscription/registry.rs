//! The open subscriptions of a node, for its limits (per user and in all), the lag gauge
//! and the renewal task. Kept apart from the subscription loop so the node's context
//! ([`crate::state::NodeState`]) can hold it without importing the service.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::Error;
use tokio_util::sync::CancellationToken;

/// The exclusive lease a subscription holds on (boundary, subscriber), as replicated
/// state names it; taken, renewed and released by [`super`].
pub struct Lease {
    pub(super) boundary: String,
    pub(super) subscriber: String,
    pub(super) holder: String,
}

/// The open subscriptions of a node: who holds them, their leases, and their lag (for the
/// `cairn_subscription_lag_events` gauge).
pub struct Registry {
    next_id: AtomicU64,
    max_total: usize,
    max_per_user: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    subscriptions: HashMap<u64, Entry>,
    per_user: HashMap<String, usize>,
}

struct Entry {
    user: String,
    boundary: String,
    lag: u64,
    /// Taken once the lease is held; renewed by the node's renewal task.
    lease: Option<Arc<Lease>>,
    /// Cancelled with the reason when a renewal fails: the subscription must end.
    lost: Arc<LeaseLost>,
}

/// Why a subscription's lease was lost, once it was.
#[derive(Default)]
pub(super) struct LeaseLost {
    pub(super) token: CancellationToken,
    error: Mutex<Option<Error>>,
}

impl LeaseLost {
    pub(super) fn lose(&self, error: Error) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
        self.token.cancel();
    }

    pub(super) fn error(&self) -> Error {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| Error::Unavailable("the subscription lost its lease".into()))
    }
}

impl Registry {
    /// A registry admitting `max_total` subscriptions, `max_per_user` of one user.
    pub fn new(max_total: usize, max_per_user: usize) -> Self {
        Registry {
            next_id: AtomicU64::new(0),
            max_total,
            max_per_user,
            open: Mutex::new(Open::default()),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a subscription of `user` on `boundary`, or RESOURCE_EXHAUSTED at a limit.
    pub(super) fn admit(self: &Arc<Self>, user: &str, boundary: &str) -> Result<Tracked, Error> {
        let mut open = self.open();
        let held = open.per_user.get(user).copied().unwrap_or(0);
        if held >= self.max_per_user {
            return Err(Error::ResourceExhausted(format!(
                "user \"{user}\" has {held} open subscriptions on this node; the limit is {} (--max-subscriptions-per-user)",
                self.max_per_user
            )));
        }
        if open.subscriptions.len() >= self.max_total {
            return Err(Error::ResourceExhausted(format!(
                "this node has {} open subscriptions; the limit is {} (--max-subscriptions)",
                open.subscriptions.len(),
                self.max_total
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let lost = Arc::new(LeaseLost::default());
        open.subscriptions.insert(
            id,
            Entry {
                user: user.to_string(),
                boundary: boundary.to_string(),
                lag: 0,
                lease: None,
                lost: lost.clone(),
            },
        );
        *open.per_user.entry(user.to_string()).or_default() += 1;
        Ok(Tracked {
            registry: self.clone(),
            id,
            lost,
        })
    }

    /// The largest lag per boundary among open subscriptions.
    pub fn max_lag_by_boundary(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for entry in self.open().subscriptions.values() {
            let max = out.entry(entry.boundary.clone()).or_default();
            *max = (*max).max(entry.lag);
        }
        out
    }

    /// Open subscriptions.
    pub fn len(&self) -> usize {
        self.open().subscriptions.len()
    }

    /// True when none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn held_leases(&self) -> Vec<(Arc<Lease>, Arc<LeaseLost>)> {
        self.open()
            .subscriptions
            .values()
            .filter_map(|e| e.lease.clone().map(|lease| (lease, e.lost.clone())))
            .collect()
    }
}

/// An admitted subscription; gives its place back on drop.
pub(super) struct Tracked {
    registry: Arc<Registry>,
    id: u64,
    pub(super) lost: Arc<LeaseLost>,
}

impl Tracked {
    pub(super) fn set_lag(&self, lag: u64) {
        if let Some(entry) = self.registry.open().subscriptions.get_mut(&self.id) {
            entry.lag = lag;
        }
    }

    /// Hands the held lease to the node's renewal task.
    pub(super) fn renew(&self, lease: Arc<Lease>) {
        if let Some(entry) = self.registry.open().subscriptions.get_mut(&self.id) {
            entry.lease = Some(lease);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut open = self.registry.open();
        if let Some(entry) = open.subscriptions.remove(&self.id)
            && let Some(held) = open.per_user.get_mut(&entry.user)
        {
            *held -= 1;
            if *held == 0 {
                open.per_user.remove(&entry.user);
            }
        }
    }
}
