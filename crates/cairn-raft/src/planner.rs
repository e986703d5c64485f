//! Pre-execution on the leader: the proposer plans a batch of appends once, against the
//! applied state plus the entries it still has in flight, and proposes the planned rows
//! ([`Command::Planned`]) instead of the commands. Every replica then writes the rows
//! without repeating the consistency checks or building the rows, provided the state the
//! entry meets is the state the plan was made on (see `AppliedMarker::state_token`); when it
//! is not (a leader change, an entry the plan did not know about), the entry writes nothing
//! and the proposer proposes the commands again without a plan.
//!
//! Only a node with peers plans: a single node applies what it proposes itself, so a plan
//! would only move the same work from one place to another.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use cairn_core::command::{Append, Bytes, Command, Outcome, PlannedAppends};
use cairn_store::{Speculation, Store};

use crate::Raft;
use crate::state_machine::applied_state_token;

/// A batch planned by [`Planner::plan`].
pub(crate) struct Plan {
    /// The entry to propose.
    pub(crate) command: Command,
    /// Each command's outcome if the plan holds.
    pub(crate) outcomes: Vec<Outcome>,
    token: u128,
    speculation: Arc<Speculation>,
}

/// An entry of this proposer's in flight, by ticket: its plan, or `None` when proposed
/// without one.
type InFlightEntry = (u64, Option<(u128, Arc<Speculation>)>);

/// The entries the proposer has in flight, oldest first (log order: the proposer proposes
/// one at a time).
#[derive(Default)]
pub(crate) struct InFlight {
    next_ticket: u64,
    entries: VecDeque<InFlightEntry>,
}

/// Shared between the proposer, which adds entries, and the tasks that wait for them to be
/// applied, which remove them.
#[derive(Clone, Default)]
pub(crate) struct InFlightEntries(Arc<Mutex<InFlight>>);

impl InFlightEntries {
    fn lock(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an entry about to be proposed; returns its ticket.
    pub(crate) fn push(&self, plan: Option<&Plan>) -> u64 {
        let mut in_flight = self.lock();
        let ticket = in_flight.next_ticket;
        in_flight.next_ticket += 1;
        in_flight
            .entries
            .push_back((ticket, plan.map(|p| (p.token, p.speculation.clone()))));
        ticket
    }

    /// Forgets an entry once it is applied, and every entry before it: they are applied
    /// too (log order), though the tasks waiting for them may not have run yet. A plan
    /// made meanwhile must not build on them.
    pub(crate) fn applied(&self, ticket: u64) {
        self.lock().entries.retain(|(t, _)| *t > ticket);
    }

    /// Forgets an entry that failed (it will not be applied, or may not be).
    pub(crate) fn failed(&self, ticket: u64) {
        self.lock().entries.retain(|(t, _)| *t != ticket);
    }

    /// Forgets an entry by how waiting for it ended.
    pub(crate) fn answered<T, E>(&self, ticket: u64, result: &Result<T, E>) {
        match result {
            Ok(_) => self.applied(ticket),
            Err(_) => self.failed(ticket),
        }
    }

    /// The state the entries in flight lead to (`None`: the applied state) and what they
    /// add; `Err(())` when one of them has no plan (its effects are unknown until applied).
    fn chain(&self) -> Result<(Option<u128>, Vec<Arc<Speculation>>), ()> {
        let in_flight = self.lock();
        let mut speculations = Vec::with_capacity(in_flight.entries.len());
        let mut last = None;
        for (_, plan) in &in_flight.entries {
            let (token, speculation) = plan.as_ref().ok_or(())?;
            speculations.push(speculation.clone());
            last = Some(*token);
        }
        Ok((last, speculations))
    }
}

/// Plans batches for one proposer.
pub(crate) struct Planner {
    store: Store,
    in_flight: InFlightEntries,
    /// Random per process: with `counter`, makes every plan's token unique.
    nonce: u64,
    counter: u64,
}

impl Planner {
    pub(crate) fn new(store: Store) -> Planner {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Planner {
            store,
            in_flight: InFlightEntries::default(),
            nonce: hasher.finish(),
            counter: 0,
        }
    }

    /// The entries in flight, which the proposer records as it proposes them.
    pub(crate) fn in_flight(&self) -> InFlightEntries {
        self.in_flight.clone()
    }

    /// A fresh plan token. The top bit stays clear: names with it set belong to states
    /// reached without a plan.
    fn next_token(&mut self) -> u128 {
        self.counter += 1;
        (u128::from(self.nonce >> 1) << 64) | u128::from(self.counter)
    }

    /// Plans `commands` when this node has peers and every command is an append; gives
    /// the commands back either way.
    pub(crate) async fn plan(
        &mut self,
        raft: &Raft,
        commands: Vec<Command>,
    ) -> (Vec<Command>, Option<Plan>) {
        let has_peers = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .nth(1)
            .is_some();
        if !has_peers || !commands.iter().all(|c| matches!(c, Command::Append(_))) {
            return (commands, None);
        }
        let Ok((chained_base, speculations)) = self.in_flight.chain() else {
            return (commands, None);
        };
        let token = self.next_token();
        let store = self.store.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let result = plan_blocking(&store, &commands, chained_base, &speculations, token);
            (commands, result)
        })
        .await;
        match planned {
            Ok((commands, Ok(plan))) => (commands, plan),
            Ok((commands, Err(e))) => {
                // Proposed without a plan, the batch is checked when applied as before.
                tracing::warn!("failed to plan a batch of {} writes: {e}", commands.len());
                (commands, None)
            }
            Err(e) => {
                tracing::error!("the planning task failed: {e}");
                (Vec::new(), None)
            }
        }
    }
}

fn plan_blocking(
    store: &Store,
    commands: &[Command],
    chained_base: Option<u128>,
    speculations: &[Arc<Speculation>],
    token: u128,
) -> Result<Option<Plan>, cairn_store::StoreError> {
    // Named before anything is read: if the state moves on while the plan reads it, the
    // entry meets another name and writes nothing.
    let base = match chained_base {
        Some(base) => base,
        None => applied_state_token(store)?,
    };
    let appends: Vec<&Append> = commands
        .iter()
        .filter_map(|c| match c {
            Command::Append(a) => Some(a),
            _ => None,
        })
        .collect();
    let Some(run) = store.plan_appends(&appends, speculations)? else {
        return Ok(None);
    };
    Ok(Some(Plan {
        command: Command::Planned(PlannedAppends {
            base,
            token,
            heads: run.heads,
            rows: Bytes(run.rows),
        }),
        outcomes: run.outcomes,
        token,
        speculation: run.speculation,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(token: u128) -> Plan {
        Plan {
            command: Command::Batch(Vec::new()),
            outcomes: Vec::new(),
            token,
            speculation: Arc::new(Speculation::default()),
        }
    }

    fn tokens(entries: &InFlightEntries) -> Result<(Option<u128>, usize), ()> {
        entries.chain().map(|(last, specs)| (last, specs.len()))
    }

    #[test]
    fn plans_build_on_the_entries_in_flight_until_they_are_answered() {
        let entries = InFlightEntries::default();
        assert_eq!(
            tokens(&entries),
            Ok((None, 0)),
            "nothing in flight: the applied state"
        );
        let first = entries.push(Some(&plan(1)));
        let second = entries.push(Some(&plan(2)));
        assert_eq!(tokens(&entries), Ok((Some(2), 2)));
        // The second is answered first (its waiting task ran first): applied in log order,
        // so the first is applied too, and neither may be built on any more.
        entries.answered(second, &Ok::<(), ()>(()));
        assert_eq!(tokens(&entries), Ok((None, 0)));
        entries.answered(first, &Ok::<(), ()>(()));

        let failed = entries.push(Some(&plan(3)));
        let kept = entries.push(Some(&plan(4)));
        entries.answered(failed, &Err::<(), ()>(()));
        assert_eq!(
            tokens(&entries),
            Ok((Some(4), 1)),
            "a failure forgets only itself"
        );
        let unplanned = entries.push(None);
        assert_eq!(
            tokens(&entries),
            Err(()),
            "no plan on an entry of unknown effects"
        );
        entries.failed(unplanned);
        entries.applied(kept);
        assert_eq!(tokens(&entries), Ok((None, 0)));
    }
}
