//! Catch-up subscriptions (S1–S3).
//!
//! One task per subscription loops: read the next page after its cursor from a storage
//! snapshot (filtered through the tag index), send it, advance; when caught up, sleep on the
//! boundary's head `watch` channel. Catch-up and live are the same loop, so there is no gap
//! or reorder at the transition, and a slow consumer only slows its own loop (the channel to
//! the client is small and bounded; events are re-read from storage, never dropped).
//!
//! The exclusive lease per (boundary, subscriber) is replicated state: acquired before the
//! first event, renewed every 5 s, released when the stream ends; a holder that vanishes
//! without releasing loses it 15 s after its last renewal.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cairn_core::command::Command;
use cairn_core::{Error, Query};
use cairn_proto::convert::{event_to_wire, position_from_wire, query_from_wire};
use cairn_proto::orisun as pb;
use cairn_proto::to_status;
use cairn_store::ReadStart;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::state::NodeState;

/// Events read from storage per page.
pub const PAGE_SIZE: usize = 512;
/// Events buffered between the subscription task and the client connection.
const CHANNEL_CAPACITY: usize = 64;

/// The response stream type.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;

/// Open subscriptions and their lag, for the `cairn_subscription_lag_events` gauge.
#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    lags: Mutex<HashMap<u64, (String, u64)>>,
}

impl Registry {
    fn register(self: &Arc<Self>, boundary: &str) -> Tracked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (boundary.to_string(), 0));
        Tracked {
            registry: self.clone(),
            id,
        }
    }

    /// The largest lag per boundary among open subscriptions.
    pub fn max_lag_by_boundary(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for (boundary, lag) in self.lags.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let max = out.entry(boundary.clone()).or_default();
            *max = (*max).max(*lag);
        }
        out
    }
}

/// A registered subscription; unregisters on drop.
struct Tracked {
    registry: Arc<Registry>,
    id: u64,
}

impl Tracked {
    fn set_lag(&self, lag: u64) {
        if let Some(entry) = self
            .registry
            .lags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.id)
        {
            entry.1 = lag;
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.registry
            .lags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

struct Lease {
    boundary: String,
    subscriber: String,
    holder: String,
}

impl Lease {
    fn command(&self, node: &NodeState) -> Command {
        Command::AcquireLease {
            boundary: self.boundary.clone(),
            subscriber: self.subscriber.clone(),
            holder: self.holder.clone(),
            at_unix_nanos: 0, // stamped by the leader's proposer
            ttl_nanos: node.config.lease_ttl.as_nanos() as i64,
        }
    }

    async fn acquire(&self, node: &NodeState) -> Result<(), Error> {
        node.execute(self.command(node)).await.map(|_| ())
    }

    async fn release(&self, node: &NodeState) {
        let release = Command::ReleaseLease {
            boundary: self.boundary.clone(),
            subscriber: self.subscriber.clone(),
            holder: self.holder.clone(),
        };
        if let Err(e) = node.execute(release).await {
            tracing::warn!(
                subscriber = %self.subscriber,
                "failed to release subscription lease (it expires on its own): {e}"
            );
        }
    }
}

/// Validates the request, takes the lease and starts the subscription task.
pub async fn open(
    node: Arc<NodeState>,
    req: pb::CatchUpSubscribeToEventStoreRequest,
) -> Result<EventStream, Error> {
    tracing::Span::current().record("boundary", req.boundary.as_str());
    // S1: the boundary gate comes first.
    let boundary = node.active_boundary(&req.boundary)?;
    if req.subscriber_name.is_empty() {
        return Err(Error::invalid("subscriber_name is empty"));
    }
    let query: Query = query_from_wire(req.query).normalize_filter()?;
    let lease = Lease {
        boundary: boundary.name.clone(),
        subscriber: req.subscriber_name.clone(),
        holder: uuid::Uuid::new_v4().to_string(),
    };
    lease.acquire(&node).await?;
    let start = match req.after_position.as_ref() {
        Some(p) => ReadStart::After(position_from_wire(p)),
        None => {
            // S2: without a position, start at the newest matching event.
            let q = query.clone();
            let bid = boundary.id;
            match node.blocking(move |s| s.newest_match_cursor(bid, &q)).await {
                Ok(cursor) => ReadStart::Prepare(cursor),
                Err(e) => {
                    lease.release(&node).await;
                    return Err(e);
                }
            }
        }
    };
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    node.metrics.subscriptions_active.inc();
    let span = tracing::info_span!("subscription", boundary = %boundary.name, subscriber = %req.subscriber_name);
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let outcome = run(&node, boundary.id, &query, start, &lease, &tx).await;
            if let Err(e) = outcome {
                tracing::info!("subscription ended: {e}");
                // The client may be gone already; then nobody needs the status.
                let _ = tx.send(Err(to_status(e))).await;
            }
            lease.release(&node).await;
            node.metrics.subscriptions_active.dec();
        },
        span,
    ));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// The subscription loop; returns Ok when the client went away.
async fn run(
    node: &NodeState,
    bid: u32,
    query: &Query,
    start: ReadStart,
    lease: &Lease,
    tx: &mpsc::Sender<Result<pb::Event, Status>>,
) -> Result<(), Error> {
    let store = node.store().clone();
    let mut heads = node.raft.heads().subscribe(&store, bid);
    let tracked = node.subscriptions.register(&lease.boundary);
    let renew_every = node.config.lease_renew;
    let mut next_renewal = Instant::now() + renew_every;
    let mut cursor = start;
    loop {
        let q = query.clone();
        let (page, next) = node
            .blocking(move |s| s.read_page(bid, &q, cursor, PAGE_SIZE))
            .await?;
        let full = page.len() >= PAGE_SIZE;
        for event in page {
            // Waiting for channel space must not starve lease renewal.
            let permit = loop {
                tokio::select! {
                    permit = tx.reserve() => match permit {
                        Ok(permit) => break permit,
                        Err(_) => return Ok(()),
                    },
                    _ = tokio::time::sleep_until(next_renewal.into()) => {
                        lease.acquire(node).await?;
                        next_renewal = Instant::now() + renew_every;
                        // A consumer that stops reading shows up as growing lag.
                        let at = event.position.prepare.max(0) as u64;
                        tracked.set_lag(store.event_count(bid).saturating_sub(at));
                    }
                    _ = node.shutdown.cancelled() => {
                        return Err(Error::Unavailable("server is shutting down".into()));
                    }
                }
            };
            permit.send(Ok(event_to_wire(event)));
            node.metrics.subscription_events.inc();
        }
        cursor = ReadStart::Prepare(next);
        tracked.set_lag(store.event_count(bid).saturating_sub(next));
        if Instant::now() >= next_renewal {
            lease.acquire(node).await?;
            next_renewal = Instant::now() + renew_every;
        }
        if full {
            continue;
        }
        // Caught up: sleep until the boundary grows past what we have read.
        loop {
            tokio::select! {
                changed = async { heads.wait_for(|head| *head > next).await.map(|_| ()) } => {
                    if changed.is_err() {
                        return Err(Error::Unavailable("server is shutting down".into()));
                    }
                    break;
                }
                _ = tokio::time::sleep_until(next_renewal.into()) => {
                    lease.acquire(node).await?;
                    next_renewal = Instant::now() + renew_every;
                }
                _ = tx.closed() => return Ok(()),
                _ = node.shutdown.cancelled() => {
                    return Err(Error::Unavailable("server is shutting down".into()));
                }
            }
        }
    }
}
