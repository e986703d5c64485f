//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run
//! and exactly one reconciles: the others wait, and take over when the leader stops renewing.
//!
//! The rules are client-go's. A candidate never trusts the timestamps in the Lease (clocks of
//! different nodes disagree): it notes, on its own monotonic clock, when it last saw the
//! record change, and takes the Lease only when nothing changed for a whole lease duration.
//! Every write carries the `resourceVersion` it read, so of two candidates racing for an
//! expired Lease the API server lets exactly one win (the other gets 409 Conflict). A leader
//! that cannot renew within its renew deadline gives up ([`Elector::hold`] returns), which
//! the operator turns into an exit: two leaders at once would fight over the same objects,
//! and a restarted process simply competes again. On a clean shutdown the leader releases
//! the Lease so a standby takes over at once instead of after the lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::metrics::Metrics;

/// How long a Lease holds without renewal (client-go's default).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader keeps trying to renew before it gives up leading.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often candidates try to acquire, and leaders renew.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Deadline of one request to the API server: a renewal must not hang past the renew
/// deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the Lease is and how it is held.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    /// The Lease's name.
    pub name: String,
    /// Its namespace (the operator's own).
    pub namespace: String,
    /// This process's identity in the Lease (its pod name).
    pub identity: String,
    /// How long the Lease holds without renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// How often candidates try and leaders renew.
    pub retry_period: Duration,
}

/// Why a [`LeaseConfig`] cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The timings do not nest.
    #[error(
        "leader election needs retry period < renew deadline < lease duration (got {retry:?}, {renew:?}, {lease:?}): a leader must retry before it gives up, and give up before a standby may take over"
    )]
    Timings {
        /// Retry period.
        retry: Duration,
        /// Renew deadline.
        renew: Duration,
        /// Lease duration.
        lease: Duration,
    },
    /// A name is empty.
    #[error("leader election needs a non-empty {0}")]
    Empty(&'static str),
}

impl LeaseConfig {
    /// Checks that the timings nest and the names are set.
    pub fn validate(self) -> Result<LeaseConfig, ConfigError> {
        for (value, what) in [
            (&self.name, "Lease name"),
            (&self.namespace, "Lease namespace"),
            (&self.identity, "identity"),
        ] {
            if value.is_empty() {
                return Err(ConfigError::Empty(what));
            }
        }
        if !(self.retry_period < self.renew_deadline && self.renew_deadline < self.lease_duration)
            || self.lease_duration.as_secs() < 1
        {
            return Err(ConfigError::Timings {
                retry: self.retry_period,
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        Ok(self)
    }
}

/// The part of a Lease that says who holds it; any change to it shows the holder is alive.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Who holds it (none or empty: released).
    pub holder: Option<String>,
    /// When the holder last renewed (its clock: compared for change only, never to ours).
    pub renew_time: Option<Timestamp>,
    /// The duration the holder promised.
    pub lease_duration: Option<Duration>,
    /// How often it changed hands.
    pub transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.as_ref();
        Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64)),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

/// A record and when (on this process's clock) it was first seen as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The record.
    pub record: Record,
    /// When it was first seen.
    pub since: Instant,
}

/// What to do with the Lease as it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// This process holds it: renew.
    Renew,
    /// Someone else holds it; it could expire in `remaining` at the earliest.
    Wait {
        /// The holder.
        holder: String,
        /// Time left before it may be taken over.
        remaining: Duration,
    },
}

/// Decides from the record as read now, `seen` (the record as this process saw it before,
/// already updated to `record` if it changed) and the local time.
pub fn decide(record: &Record, seen: &Seen, me: &str, now: Instant, default: Duration) -> Decision {
    match &record.holder {
        None => Decision::Acquire,
        Some(holder) if holder == me => Decision::Renew,
        Some(holder) => {
            let duration = record.lease_duration.unwrap_or(default);
            let quiet = now.saturating_duration_since(seen.since);
            if quiet >= duration {
                Decision::Acquire
            } else {
                Decision::Wait {
                    holder: holder.clone(),
                    remaining: duration - quiet,
                }
            }
        }
    }
}

/// Why an election step failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The API server refused or could not be reached.
    #[error("failed to {what} the Lease {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        what: &'static str,
        /// The Lease's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error (boxed: it is large and errors are rare).
        source: Box<kube::Error>,
    },
    /// The API server did not answer in time.
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// Why a leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum LostLease {
    /// Another process holds the Lease now.
    #[error("{0} took the Lease over")]
    TakenOver(String),
    /// Renewing failed until the renew deadline passed.
    #[error("could not renew the Lease within {deadline:?}: {last}")]
    RenewDeadline {
        /// The deadline.
        deadline: Duration,
        /// The last failure.
        last: String,
    },
}

/// One process's side of the election.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    seen: Option<Seen>,
    metrics: std::sync::Arc<Metrics>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The outcome of one attempt.
enum Attempt {
    Leading,
    Waiting { holder: String },
}

impl Elector {
    /// An elector for `config` (validated) over `client`.
    pub fn new(client: Client, config: LeaseConfig, metrics: std::sync::Arc<Metrics>) -> Elector {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            seen: None,
            metrics,
        }
    }

    /// Waits until this process holds the Lease. Failures are logged and retried.
    pub async fn acquire(&mut self) {
        let mut waiting_for = None;
        loop {
            match self.attempt().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(
                        lease = %self.config.name,
                        namespace = %self.config.namespace,
                        identity = %self.config.identity,
                        "acquired the leader Lease: reconciling"
                    );
                    self.metrics.leader.set(1);
                    self.metrics.leader_acquisitions.inc();
                    return;
                }
                Ok(Attempt::Waiting { holder }) => {
                    if waiting_for.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.config.name, %holder, "standing by: another operator leads");
                        waiting_for = Some(holder);
                    }
                }
                Err(e) => tracing::warn!("leader election: {e}; retrying"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the Lease every retry period; returns when leadership is lost.
    pub async fn hold(&mut self) -> LostLease {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let lost = match self.attempt().await {
                Ok(Attempt::Leading) => {
                    last_renewed = Instant::now();
                    continue;
                }
                Ok(Attempt::Waiting { holder }) => LostLease::TakenOver(holder),
                Err(e) if last_renewed.elapsed() < self.config.renew_deadline => {
                    tracing::warn!("leader election: failed to renew, retrying: {e}");
                    continue;
                }
                Err(e) => LostLease::RenewDeadline {
                    deadline: self.config.renew_deadline,
                    last: e.to_string(),
                },
            };
            self.metrics.leader.set(0);
            return lost;
        }
    }

    /// Gives the Lease up (on a clean shutdown), so a standby takes over at its next try
    /// instead of after the lease duration. Failures are logged: the Lease then expires.
    pub async fn release(&mut self) {
        self.metrics.leader.set(0);
        let result = async {
            let Some(mut lease) = self.get().await? else {
                return Ok(false);
            };
            if Record::of(&lease).holder.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.replace(&lease).await.map(|_| true)
        }
        .await;
        match result {
            Ok(true) => tracing::info!(lease = %self.config.name, "released the leader Lease"),
            Ok(false) => {}
            Err(e) => tracing::warn!("failed to release the leader Lease (it will expire): {e}"),
        }
    }

    /// Reads the Lease and acquires, renews or waits, as [`decide`] says.
    async fn attempt(&mut self) -> Result<Attempt, ElectionError> {
        let now = Instant::now();
        let Some(mut lease) = self.get().await? else {
            return self.create().await;
        };
        let record = Record::of(&lease);
        let seen = match self.seen.take() {
            Some(seen) if seen.record == record => seen,
            _ => Seen {
                record: record.clone(),
                since: now,
            },
        };
        let decision = decide(
            &record,
            &seen,
            &self.config.identity,
            now,
            self.config.lease_duration,
        );
        self.seen = Some(seen);
        if let Decision::Wait { holder, .. } = decision {
            return Ok(Attempt::Waiting { holder });
        }
        let stamp = MicroTime(Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if decision == Decision::Acquire {
            spec.acquire_time = Some(stamp.clone());
            // Every change of hands counts, a released Lease's too (client-go counts the same).
            spec.lease_transitions = Some(record.transitions + 1);
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(self.config.lease_duration.as_secs() as i32);
        spec.renew_time = Some(stamp);
        let written = self.replace(&lease).await;
        self.written(written, record.holder)
    }

    /// The outcome of writing the Lease: leading when it was stored (and noted as seen), or
    /// waiting when someone else wrote it since it was read (409: they won this round).
    fn written(
        &mut self,
        result: Result<Lease, ElectionError>,
        rival: Option<String>,
    ) -> Result<Attempt, ElectionError> {
        match result {
            Ok(stored) => {
                self.seen = Some(Seen {
                    record: Record::of(&stored),
                    since: Instant::now(),
                });
                Ok(Attempt::Leading)
            }
            Err(ElectionError::Api { source, .. }) if matches!(&*source, kube::Error::Api(status) if status.code == 409) => {
                Ok(Attempt::Waiting {
                    holder: rival.unwrap_or_else(|| "another candidate".into()),
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn create(&mut self) -> Result<Attempt, ElectionError> {
        let stamp = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(self.config.lease_duration.as_secs() as i32),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        let created = self
            .timed(self.api.create(&PostParams::default(), &lease), "create")
            .await;
        self.written(created, None)
    }

    async fn get(&self) -> Result<Option<Lease>, ElectionError> {
        self.timed(self.api.get_opt(&self.config.name), "read")
            .await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ElectionError> {
        self.timed(
            self.api
                .replace(&self.config.name, &PostParams::default(), lease),
            "write",
        )
        .await
    }

    async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
        what: &'static str,
    ) -> Result<T, ElectionError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Ok(result) => result.map_err(|source| ElectionError::Api {
                what,
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                source: Box::new(source),
            }),
            Err(_) => Err(ElectionError::Timeout(REQUEST_TIMEOUT)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn record(holder: Option<&str>) -> Record {
        Record {
            holder: holder.map(String::from),
            renew_time: Some(Timestamp::UNIX_EPOCH),
            lease_duration: Some(LEASE),
            transitions: 3,
        }
    }

    fn seen(record: &Record, since: Instant) -> Seen {
        Seen {
            record: record.clone(),
            since,
        }
    }

    #[test]
    fn a_released_or_unheld_lease_is_taken_at_once() {
        let now = Instant::now();
        for r in [record(None), Record::of(&Lease::default())] {
            assert_eq!(
                decide(&r, &seen(&r, now), "me", now, LEASE),
                Decision::Acquire
            );
        }
    }

    #[test]
    fn the_holder_renews() {
        let now = Instant::now();
        let r = record(Some("me"));
        assert_eq!(
            decide(&r, &seen(&r, now), "me", now, LEASE),
            Decision::Renew
        );
    }

    #[test]
    fn another_holder_is_waited_out_for_a_whole_duration_on_our_own_clock() {
        let start = Instant::now();
        let r = record(Some("them"));
        let first = seen(&r, start);
        assert_eq!(
            decide(&r, &first, "me", start + Duration::from_secs(5), LEASE),
            Decision::Wait {
                holder: "them".into(),
                remaining: Duration::from_secs(10)
            }
        );
        assert_eq!(
            decide(&r, &first, "me", start + LEASE, LEASE),
            Decision::Acquire,
            "nothing changed for a whole lease duration"
        );
    }

    #[test]
    fn the_duration_the_holder_promised_wins_over_ours() {
        let start = Instant::now();
        let mut r = record(Some("them"));
        r.lease_duration = Some(Duration::from_secs(60));
        assert!(matches!(
            decide(&r, &seen(&r, start), "me", start + LEASE, LEASE),
            Decision::Wait { .. }
        ));
        r.lease_duration = None;
        assert_eq!(
            decide(&r, &seen(&r, start), "me", start + LEASE, LEASE),
            Decision::Acquire,
            "without a promise, our own duration"
        );
    }

    #[test]
    fn timings_must_nest() {
        let config = LeaseConfig {
            name: "cairn-operator".into(),
            namespace: "cairn-system".into(),
            identity: "cairn-0".into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        };
        assert_eq!(config.clone().validate(), Ok(config.clone()));
        for (retry, renew, lease) in [(2, 10, 10), (10, 10, 15), (12, 10, 15), (0, 0, 0)] {
            let bad = LeaseConfig {
                retry_period: Duration::from_secs(retry),
                renew_deadline: Duration::from_secs(renew),
                lease_duration: Duration::from_secs(lease),
                ..config.clone()
            };
            assert!(
                matches!(bad.validate(), Err(ConfigError::Timings { .. })),
                "{retry} {renew} {lease}"
            );
        }
        let unnamed = LeaseConfig {
            identity: String::new(),
            ..config
        };
        assert_eq!(unnamed.validate(), Err(ConfigError::Empty("identity")));
    }
}
