//! The proposer: the one task that submits commands to Raft on the leader, folding
//! concurrent writes into shared log entries (group commit) and stamping them with the
//! leader's clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::command::{Applied, Command, Outcome};
use cairn_store::Store;
use openraft::BasicNode;
use openraft::error::{ClientWriteError, RaftError as OpenRaftError};
use openraft::raft::ClientWriteResponse;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::planner::{InFlightEntries, Plan, Planner};
use crate::state_machine::STALE_PLAN;
use crate::{Raft, RaftError, RaftObserver};

/// Largest number of commands folded into one Raft entry.
pub const MAX_BATCH_COMMANDS: usize = 1024;
/// Largest approximate size of the commands folded into one Raft entry.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Default number of batch entries proposed and not yet applied. While one is, small
/// commands accumulate into the next batch; only a batch of at least
/// [`PIPELINE_MIN_BATCH_BYTES`] is proposed alongside (see [`run_proposer`]).
pub const DEFAULT_MAX_INFLIGHT_BATCHES: usize = 2;
/// Smallest batch proposed while another is still in flight. Below it, waiting for the
/// running batch and folding more commands into one entry is cheaper (every entry has a
/// fixed cost in openraft, the log and the state machine: two small batches in flight
/// measured 20% slower than one for single-event writes); above it, appending and syncing
/// the next batch while the state machine applies the previous one keeps both cores busy.
pub const PIPELINE_MIN_BATCH_BYTES: usize = 64 * 1024;
/// Commands waiting for the proposer before writers are made to wait.
pub(crate) const PROPOSER_QUEUE: usize = 16 * 1024;

pub(crate) type Reply = oneshot::Sender<Result<Outcome, RaftError>>;
/// A command on its way to the proposer, with its reply channel and approximate size.
pub(crate) type Queued = (Command, Reply, usize);

/// Turns a Raft write failure into the error each waiting caller gets.
fn write_error(e: &OpenRaftError<u64, ClientWriteError<u64, BasicNode>>) -> RaftError {
    match e {
        // openraft answers ForwardToLeader before it appends an entry, or after a new
        // leader's log made it delete the entry: either way it is not and never will be
        // applied, so the command may go to the leader.
        OpenRaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            RaftError::ForwardToLeader {
                leader_id: f.leader_id,
                leader_addr: f.leader_node.as_ref().map(|n| n.addr.clone()),
            }
        }
        OpenRaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            RaftError::Fatal(e.to_string())
        }
        OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
    }
}

/// Hands each caller its outcome once the entry carrying its command is applied.
fn distribute(
    result: Result<ClientWriteResponse<crate::TypeConfig>, RaftError>,
    mut replies: Vec<Reply>,
    batched: bool,
) {
    match result {
        Ok(response) if !batched => {
            if let Some(reply) = replies.pop() {
                let _ = reply.send(Ok(response.data));
            }
        }
        Ok(ClientWriteResponse {
            data: Ok(Applied::Batch(outcomes)),
            ..
        }) if outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that gave up waiting does not need its outcome.
                let _ = reply.send(Ok(outcome));
            }
        }
        Ok(other) => {
            tracing::error!(
                "a batch entry produced an unexpected outcome: {:?}",
                other.data
            );
            for reply in replies {
                let _ = reply.send(Err(RaftError::Fatal(
                    "a batch entry produced an unexpected outcome".to_string(),
                )));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.for_another_caller()));
            }
        }
    }
}

/// Approximate bytes of the commands sent to the proposer and not yet folded into a batch.
/// Writers add to it and wake the proposer once it crosses [`PIPELINE_MIN_BATCH_BYTES`]:
/// one atomic add per command instead of one task wake-up.
#[derive(Default)]
pub(crate) struct Backlog {
    bytes: AtomicUsize,
    large: Notify,
}

impl Backlog {
    pub(crate) fn add(&self, bytes: usize) {
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if before < PIPELINE_MIN_BATCH_BYTES && before + bytes >= PIPELINE_MIN_BATCH_BYTES {
            self.large.notify_one();
        }
    }

    fn take(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Commands folded so far into the next batch entry.
#[derive(Default)]
struct PendingBatch {
    commands: Vec<(Command, Reply)>,
    bytes: usize,
}

impl PendingBatch {
    fn push(&mut self, (mut command, reply, bytes): Queued, backlog: &Backlog) {
        backlog.take(bytes);
        command.stamp(unix_nanos());
        self.bytes += bytes;
        self.commands.push((command, reply));
    }

    fn is_full(&self) -> bool {
        self.commands.len() >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// Folds in every command already waiting, up to the batch limits.
    fn fill_from(&mut self, queue: &mut mpsc::Receiver<Queued>, backlog: &Backlog) {
        while !self.is_full() {
            match queue.try_recv() {
                Ok(next) => self.push(next, backlog),
                Err(_) => break,
            }
        }
    }
}

/// The proposer: the one task that submits commands to Raft. Commands that arrive while
/// earlier batches are in flight are folded into one `Command::Batch` entry, so a burst of
/// concurrent writes costs one log append, one fsync and one apply pass (group commit).
/// openraft 0.9 runs its engine once per client write, so batching must happen here.
///
/// With nothing in flight a batch goes at once; while one is in flight, the next goes only
/// once it holds [`PIPELINE_MIN_BATCH_BYTES`] (and fewer than `max_inflight` are out), so
/// large writes pipeline and small ones keep the largest group commits.
pub(crate) async fn run_proposer(
    raft: Raft,
    mut queue: mpsc::Receiver<Queued>,
    backlog: Arc<Backlog>,
    observer: Arc<dyn RaftObserver>,
    max_inflight: usize,
    snapshot_every_bytes: u64,
    mut planner: Planner,
) {
    let entries = planner.in_flight();
    let max_inflight = max_inflight.max(1);
    let in_flight = Arc::new(Semaphore::new(max_inflight));
    let finished = Arc::new(Notify::new());
    let mut proposed_since_snapshot: u64 = 0;
    let mut pending = PendingBatch::default();
    loop {
        if pending.commands.is_empty() {
            let Some(first) = queue.recv().await else {
                return;
            };
            pending.push(first, &backlog);
        }
        pending.fill_from(&mut queue, &backlog);
        let idle = in_flight.available_permits() == max_inflight;
        let permit = if idle || pending.bytes >= PIPELINE_MIN_BATCH_BYTES {
            in_flight.clone().try_acquire_owned().ok()
        } else {
            None
        };
        let Some(permit) = permit else {
            // Wait for a batch to finish, or for the queue to hold enough to make this batch
            // large enough to go alongside. Writers signal the latter (see `Backlog`), so
            // the proposer is not woken for every small command.
            tokio::select! {
                () = finished.notified() => {}
                () = backlog.large.notified() => {}
            }
            continue;
        };
        proposed_since_snapshot += pending.bytes as u64;
        if proposed_since_snapshot >= snapshot_every_bytes {
            proposed_since_snapshot = 0;
            // openraft's own policy counts entries only; a snapshot lets it purge the log.
            // It is built from what is applied by then, so it trails this batch slightly.
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::warn!("failed to trigger a size-based snapshot: {e}");
            }
        }
        observer.proposed(pending.commands.len(), !idle);
        let (commands, replies): (Vec<Command>, Vec<Reply>) =
            std::mem::take(&mut pending).commands.into_iter().unzip();
        let (commands, plan) = planner.plan(&raft, commands).await;
        let slot = InFlightSlot {
            permit: Some(permit),
            finished: finished.clone(),
        };
        let batch = Proposed {
            raft: raft.clone(),
            commands,
            replies,
            entries: entries.clone(),
            _slot: slot,
        };
        match plan {
            Some(plan) => batch.propose_planned(plan).await,
            None => batch.propose().await,
        }
    }
}

/// A proposed batch's in-flight slot. Dropping it frees the slot, then wakes the proposer,
/// whichever way the batch ends.
struct InFlightSlot {
    permit: Option<OwnedSemaphorePermit>,
    finished: Arc<Notify>,
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        // The slot must be free before the proposer looks at it again.
        drop(self.permit.take());
        self.finished.notify_one();
    }
}

/// A batch on its way into the log, holding its in-flight slot until it is answered.
struct Proposed {
    raft: Raft,
    commands: Vec<Command>,
    replies: Vec<Reply>,
    entries: InFlightEntries,
    _slot: InFlightSlot,
}

/// The entry a batch of commands is proposed as: the command itself when alone.
fn batch_command(mut commands: Vec<Command>) -> (Command, bool) {
    if commands.len() == 1
        && let Some(command) = commands.pop()
    {
        return (command, false);
    }
    (Command::Batch(commands), true)
}

impl Proposed {
    /// Frees the in-flight slot, then hands every caller its share of `result`.
    fn answer_all(
        mut self,
        result: Result<ClientWriteResponse<crate::TypeConfig>, RaftError>,
        batched: bool,
    ) {
        let replies = std::mem::take(&mut self.replies);
        drop(self);
        distribute(result, replies, batched);
    }

    /// Submits the batch's commands as one entry; a spawned task hands out the outcomes
    /// once it is applied, then frees the in-flight slot.
    async fn propose(mut self) {
        let ticket = self.entries.push(None);
        let (command, batched) = batch_command(std::mem::take(&mut self.commands));
        match self.raft.client_write_ff(command.into()).await {
            Ok(pending) => {
                tokio::spawn(async move {
                    let result = answer(pending.await);
                    self.entries.answered(ticket, &result);
                    self.answer_all(result, batched);
                });
            }
            Err(fatal) => {
                self.entries.failed(ticket);
                self.answer_all(Err(RaftError::Fatal(fatal.to_string())), batched);
            }
        }
    }

    /// Submits the batch as its leader's plan; when applied on a state other than the one
    /// planned on (it wrote nothing), the commands go again, without a plan.
    async fn propose_planned(self, plan: Plan) {
        let ticket = self.entries.push(Some(&plan));
        let outcomes = plan.outcomes;
        match self.raft.client_write_ff(plan.command.into()).await {
            Ok(pending) => {
                tokio::spawn(async move {
                    let result = answer(pending.await);
                    self.entries.answered(ticket, &result);
                    let response = match result {
                        Ok(response) => response,
                        Err(e) => return self.answer_all(Err(e), true),
                    };
                    match response.data {
                        // Held: the outcomes are the plan's, as one batch's.
                        Ok(Applied::Done) => self.answer_all(
                            Ok(ClientWriteResponse {
                                log_id: response.log_id,
                                data: Ok(Applied::Batch(outcomes)),
                                membership: response.membership,
                            }),
                            true,
                        ),
                        Err(cairn_core::Error::Unavailable(m)) if m == STALE_PLAN => {
                            self.propose().await
                        }
                        other => self.answer_all(
                            Err(RaftError::Fatal(format!(
                                "a planned entry produced an unexpected outcome: {other:?}"
                            ))),
                            true,
                        ),
                    }
                });
            }
            Err(fatal) => {
                self.entries.failed(ticket);
                self.answer_all(Err(RaftError::Fatal(fatal.to_string())), true);
            }
        }
    }
}

/// What waiting for a proposed entry came to.
fn answer(
    waited: Result<
        Result<ClientWriteResponse<crate::TypeConfig>, ClientWriteError<u64, BasicNode>>,
        oneshot::error::RecvError,
    >,
) -> Result<ClientWriteResponse<crate::TypeConfig>, RaftError> {
    match waited {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) => Err(write_error(&OpenRaftError::APIError(e))),
        Err(_) => Err(RaftError::Fatal("raft dropped a proposal".to_string())),
    }
}

/// Nanoseconds since the Unix epoch on this (the leader's) clock.
fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Handle of the proposer task (one per node; it proposes only while the node leads).
pub(crate) struct Proposer {
    queue: mpsc::Sender<Queued>,
    backlog: Arc<Backlog>,
    task: tokio::task::JoinHandle<()>,
}

impl Proposer {
    /// Starts the proposer task for `raft`.
    pub(crate) fn spawn(
        raft: Raft,
        store: Store,
        observer: Arc<dyn RaftObserver>,
        max_inflight: usize,
        snapshot_every_bytes: u64,
    ) -> Proposer {
        let (queue, receiver) = mpsc::channel(PROPOSER_QUEUE);
        let backlog = Arc::new(Backlog::default());
        let task = tokio::spawn(run_proposer(
            raft,
            receiver,
            backlog.clone(),
            observer,
            max_inflight,
            snapshot_every_bytes.max(1),
            Planner::new(store),
        ));
        Proposer {
            queue,
            backlog,
            task,
        }
    }

    /// Hands `command` to the proposer and waits for its outcome.
    pub(crate) async fn submit(&self, command: Command) -> Result<Outcome, RaftError> {
        let (reply, outcome) = oneshot::channel();
        let bytes = command.approx_bytes();
        self.backlog.add(bytes);
        self.queue
            .send((command, reply, bytes))
            .await
            .map_err(|_| RaftError::Fatal("the proposer has stopped".to_string()))?;
        outcome
            .await
            .map_err(|_| RaftError::Fatal("the proposer dropped a command".to_string()))?
    }

    /// Stops the task; commands not yet proposed fail.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::command::Append;
    use openraft::{CommittedLeaderId, LogId};

    fn append(at: i64) -> Command {
        Command::Append(Append {
            boundary: "b".into(),
            observations: vec![],
            events: vec![],
            at_unix_nanos: at,
        })
    }

    fn queued(
        command: Command,
        bytes: usize,
    ) -> (Queued, oneshot::Receiver<Result<Outcome, RaftError>>) {
        let (reply, outcome) = oneshot::channel();
        ((command, reply, bytes), outcome)
    }

    #[test]
    fn a_batch_stamps_commands_with_this_clock_and_stops_at_its_limits() {
        let backlog = Backlog::default();
        let mut batch = PendingBatch::default();
        let before = unix_nanos();
        let (q, _rx) = queued(append(0), 10);
        backlog.add(10);
        batch.push(q, &backlog);
        let Command::Append(a) = &batch.commands[0].0 else {
            unreachable!()
        };
        assert!(
            a.at_unix_nanos >= before,
            "stamped by the proposer, not the caller"
        );
        assert_eq!(
            backlog.bytes.load(Ordering::Acquire),
            0,
            "taken off the backlog"
        );
        assert!(!batch.is_full());
        let (q, _rx2) = queued(append(0), MAX_BATCH_BYTES);
        batch.push(q, &backlog);
        assert!(batch.is_full(), "a batch holds at most MAX_BATCH_BYTES");
    }

    #[tokio::test]
    async fn the_backlog_wakes_the_proposer_once_when_it_becomes_large() {
        let backlog = Backlog::default();
        backlog.add(PIPELINE_MIN_BATCH_BYTES - 1);
        backlog.add(1);
        // The crossing stored a permit: this completes at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), backlog.large.notified())
            .await
            .expect("woken when the backlog reached the pipelining size");
    }

    #[tokio::test]
    async fn forward_to_leader_reaches_every_caller_of_the_batch() {
        let (r1, o1) = oneshot::channel();
        let (r2, o2) = oneshot::channel();
        let error = write_error(&OpenRaftError::APIError(ClientWriteError::ForwardToLeader(
            openraft::error::ForwardToLeader {
                leader_id: Some(2),
                leader_node: Some(BasicNode {
                    addr: "n2:5006".into(),
                }),
            },
        )));
        distribute(Err(error), vec![r1, r2], true);
        for outcome in [o1, o2] {
            match outcome.await.expect("answered") {
                Err(RaftError::ForwardToLeader {
                    leader_id,
                    leader_addr,
                }) => {
                    assert_eq!(leader_id, Some(2));
                    assert_eq!(leader_addr.as_deref(), Some("n2:5006"));
                }
                other => panic!("expected ForwardToLeader, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn batch_outcomes_go_to_their_callers_in_order() {
        let (r1, o1) = oneshot::channel();
        let (r2, o2) = oneshot::channel();
        let response = ClientWriteResponse::<crate::TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 5),
            data: Ok(Applied::Batch(vec![
                Ok(Applied::Done),
                Err(cairn_core::Error::NotFound("x".into())),
            ])),
            membership: None,
        };
        distribute(Ok(response), vec![r1, r2], true);
        assert!(matches!(o1.await, Ok(Ok(Ok(Applied::Done)))));
        assert!(matches!(
            o2.await,
            Ok(Ok(Err(cairn_core::Error::NotFound(_))))
        ));
    }
}
