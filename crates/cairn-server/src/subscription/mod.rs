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
//! without releasing loses it 15 s after its last renewal. One task per node renews every
//! open subscription's lease at once, so the renewals of a node's subscriptions fold into
//! the same few Raft entries; a subscription whose renewal fails ends with that error, and
//! every subscription of a node removed from the cluster ends at its next renewal.
//!
//! Subscriptions are a user's standing claim on a node (a task, a lease renewed through
//! Raft), so a user holds at most `--max-subscriptions-per-user` of them on a node and a
//! node at most `--max-subscriptions`; names are at most [`MAX_SUBSCRIBER_NAME_BYTES`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use cairn_core::command::Command;
use cairn_core::limits::MAX_SUBSCRIBER_NAME_BYTES;
use cairn_core::{Error, Query};
use cairn_proto::convert::{event_to_wire, position_from_wire, query_from_wire};
use cairn_proto::orisun as pb;
use cairn_proto::to_status;
use cairn_store::{PageLimit, ReadStart};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::auth::Principal;

mod registry;

use crate::state::NodeState;
pub use registry::Registry;
use registry::{Lease, Tracked};

/// Events read from storage per page.
pub const PAGE_SIZE: usize = 512;
/// Events buffered between the subscription task and the client connection.
const CHANNEL_CAPACITY: usize = 64;

/// The response stream type.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;

/// Why a subscription on a node removed from the cluster ends.
pub const NOT_A_MEMBER: &str = "this node was removed from the cluster and receives no more events: subscribe through a member";

/// Renews the lease of every open subscription every `--lease-renew` (5 s), all at once:
/// concurrent proposals fold into the same Raft entries. A subscription whose renewal
/// fails ends with the error.
pub fn spawn_renewals(node: Arc<NodeState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(node.config.lease_renew);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; leases were just taken.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = node.shutdown.cancelled() => return,
            }
            let held = node.subscriptions.held_leases();
            if !held.is_empty() && removed_from_cluster(&node).await {
                // A removed node that keeps running applies nothing more, yet its renewals
                // would still succeed through the leader: its subscriptions would stay
                // open and silent. End them, so their clients go to a member.
                for (lease, lost) in &held {
                    tracing::info!(
                        subscriber = %lease.subscriber,
                        boundary = %lease.boundary,
                        "this node is no longer a member of the cluster; the subscription ends"
                    );
                    lost.lose(Error::Unavailable(NOT_A_MEMBER.into()));
                }
                continue;
            }
            let renewals = held.iter().map(|(lease, lost)| {
                let node = &node;
                async move {
                    if let Err(e) = lease.acquire(node).await {
                        tracing::info!(
                            subscriber = %lease.subscriber,
                            boundary = %lease.boundary,
                            "failed to renew a subscription lease; the subscription ends: {e}"
                        );
                        lost.lose(e);
                    }
                }
            });
            futures::future::join_all(renewals).await;
        }
    })
}

/// True when this node knows it is no longer a member: its own membership says so, or
/// the leader's does. A removed learner usually never hears of its removal (the leader
/// stops replicating to it at once), so a follower asks the leader; an unanswered
/// question counts as "still a member" (the lease renewal fails on its own then).
async fn removed_from_cluster(node: &NodeState) -> bool {
    if !node.raft.is_member() {
        return true;
    }
    if node.raft.is_leader() {
        return false;
    }
    let Some(leader) = node.raft.leader() else {
        return false;
    };
    match node.peers.status(&leader.addr).await {
        Ok(status) => {
            let own = node.raft.node_id();
            // Only the leader's own view counts: a node that lost leadership answers
            // with a membership that may be stale.
            status.role == "leader" && !status.members.iter().any(|m| m.node_id == own)
        }
        Err(e) => {
            tracing::debug!("failed to ask the leader whether this node is still a member: {e}");
            false
        }
    }
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
        node.router.execute(self.command(node)).await.map(|_| ())
    }

    async fn release(&self, node: &NodeState) {
        let release = Command::ReleaseLease {
            boundary: self.boundary.clone(),
            subscriber: self.subscriber.clone(),
            holder: self.holder.clone(),
        };
        if let Err(e) = node.router.execute(release).await {
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
    principal: &Principal,
    req: pb::CatchUpSubscribeToEventStoreRequest,
) -> Result<EventStream, Error> {
    tracing::Span::current().record("boundary", req.boundary.as_str());
    // The start cursor and the boundary gate must see everything committed before this
    // call, as every read does: on a lagging node an `after_position` beyond the local
    // head was clamped to it (events the client had were sent again), "newest" was stale,
    // and a boundary created elsewhere was not active yet.
    node.router.read_barrier().await?;
    // S1: the boundary gate comes first.
    let boundary = node.active_boundary(&req.boundary)?;
    if req.subscriber_name.is_empty() {
        return Err(Error::invalid("subscriber_name is empty"));
    }
    if req.subscriber_name.len() > MAX_SUBSCRIBER_NAME_BYTES {
        return Err(Error::invalid(format!(
            "subscriber_name is {} bytes; the limit is {MAX_SUBSCRIBER_NAME_BYTES}",
            req.subscriber_name.len()
        )));
    }
    let query: Query = query_from_wire(req.query).normalize_filter()?;
    let tracked = node
        .subscriptions
        .admit(&principal.username, &boundary.name)?;
    let lease = Arc::new(Lease {
        boundary: boundary.name.clone(),
        subscriber: req.subscriber_name.clone(),
        holder: uuid::Uuid::new_v4().to_string(),
    });
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
    tracked.renew(lease.clone());
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let outcome = run(&node, boundary.id, &query, start, &tracked, &tx).await;
            // Not renewed from here on: released below.
            drop(tracked);
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
    tracked: &Tracked,
    tx: &mpsc::Sender<Result<pb::Event, Status>>,
) -> Result<(), Error> {
    let store = node.store().clone();
    let mut heads = node.raft.heads().subscribe(&store, bid);
    let lag_every = node.config.lease_renew;
    let mut next_lag = Instant::now() + lag_every;
    let limit = PageLimit {
        events: PAGE_SIZE,
        bytes: node.config.max_response_bytes,
    };
    let lost = &tracked.lost.token;
    let mut cursor = start;
    loop {
        let q = query.clone();
        let (page, next) = node
            .blocking(move |s| s.read_page(bid, &q, cursor, limit))
            .await?;
        // A page cut short by its limit continues at once; any other reached the head.
        let full = page.len() >= limit.events
            || page.iter().map(cairn_store::event_bytes).sum::<usize>() >= limit.bytes;
        for event in page {
            let permit = loop {
                tokio::select! {
                    permit = tx.reserve() => match permit {
                        Ok(permit) => break permit,
                        Err(_) => return Ok(()),
                    },
                    _ = tokio::time::sleep_until(next_lag.into()) => {
                        // A consumer that stops reading shows up as growing lag.
                        let at = event.position.prepare.max(0) as u64;
                        tracked.set_lag(store.event_count(bid).saturating_sub(at));
                        next_lag = Instant::now() + lag_every;
                    }
                    _ = lost.cancelled() => return Err(tracked.lost.error()),
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
        if full {
            continue;
        }
        // Caught up: sleep until the boundary grows past what we have read.
        tokio::select! {
            changed = async { heads.wait_for(|head| *head > next).await.map(|_| ()) } => {
                if changed.is_err() {
                    return Err(Error::Unavailable("server is shutting down".into()));
                }
            }
            _ = lost.cancelled() => return Err(tracked.lost.error()),
            _ = tx.closed() => return Ok(()),
            _ = node.shutdown.cancelled() => {
                return Err(Error::Unavailable("server is shutting down".into()));
            }
        }
    }
}
