//! The operator's Prometheus metrics: one registry, families registered when the process
//! starts and handed to the reconciles through [`crate::controller::Context`]. Error labels
//! come from [`crate::controller::Error::reason`], never from message text.

use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::controller::Error;

/// Every value [`Error::reason`] returns, so each error series exists (at 0) from the start
/// and a rate over it is defined before the first failure.
pub const ERROR_REASONS: &[&str] = &[
    "read",
    "apply",
    "status",
    "cleanup",
    "serialise",
    "finalizer",
];

/// Reconcile durations: from a settled pass (a few reads and patches, ~10 ms) to a pass that
/// waits on slow nodes' cluster API (seconds).
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Metric families of the operator.
pub struct Metrics {
    registry: Registry,
    /// Reconciles run, successful or not.
    pub reconciles: IntCounter,
    /// Failed reconciles by reason.
    pub reconcile_errors: IntCounterVec,
    /// How long a reconcile took (seconds).
    pub reconcile_duration: Histogram,
    /// 1 while this process holds the leader Lease (or runs without leader election).
    pub leader: IntGauge,
    /// Times this process became the leader.
    pub leader_acquisitions: IntCounter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every family in a new registry.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m;
                registry.register(Box::new(m.clone()))?;
                m
            }};
        }
        let metrics = Metrics {
            reconciles: reg!(IntCounter::new(
                "cairn_operator_reconciles_total",
                "Reconciles of Boundaries run, successful or not"
            )?),
            reconcile_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_operator_reconcile_errors_total",
                    "Failed reconciles by reason (read, apply, status, cleanup, serialise, finalizer)"
                ),
                &["reason"]
            )?),
            reconcile_duration: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_operator_reconcile_duration_seconds",
                    "Duration of a reconcile of one Boundary"
                )
                .buckets(DURATION_BUCKETS.to_vec())
            )?),
            leader: reg!(IntGauge::new(
                "cairn_operator_leader",
                "1 while this operator process holds the leader Lease and reconciles"
            )?),
            leader_acquisitions: reg!(IntCounter::new(
                "cairn_operator_leader_acquisitions_total",
                "Times this operator process became the leader"
            )?),
            registry,
        };
        for reason in ERROR_REASONS {
            metrics.reconcile_errors.with_label_values(&[reason]);
        }
        Ok(metrics)
    }

    /// Records one reconcile that started at `started`.
    pub fn reconciled<T>(&self, started: Instant, result: &Result<T, Error>) {
        self.reconciles.inc();
        self.reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = result {
            self.reconcile_errors.with_label_values(&[e.reason()]).inc();
        }
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("failed to encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_reconcile_counts_under_its_reason_and_every_reason_starts_at_zero() {
        let metrics = Metrics::new().expect("register");
        let text = metrics.render();
        for reason in ERROR_REASONS {
            assert!(
                text.contains(&format!(
                    "cairn_operator_reconcile_errors_total{{reason=\"{reason}\"}} 0"
                )),
                "{reason} missing:\n{text}"
            );
        }
        let failed: Result<(), Error> = Err(Error::Serialise {
            what: "x".into(),
            source: serde_json::from_str::<u8>("no").expect_err("not a number"),
        });
        metrics.reconciled(Instant::now(), &failed);
        metrics.reconciled(Instant::now(), &Ok::<(), Error>(()));
        let text = metrics.render();
        assert!(text.contains("cairn_operator_reconciles_total 2"), "{text}");
        assert!(
            text.contains("cairn_operator_reconcile_errors_total{reason=\"serialise\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cairn_operator_reconcile_duration_seconds_count 2"),
            "{text}"
        );
    }

    #[test]
    fn every_reason_an_error_can_give_is_listed() {
        let kube_error = || kube::Error::LinesCodecMaxLineLengthExceeded;
        let errors = [
            Error::Read {
                what: "x".into(),
                source: kube_error(),
            },
            Error::Apply {
                what: "x".into(),
                source: kube_error(),
            },
            Error::Status {
                name: "x".into(),
                source: kube_error(),
            },
            Error::Cleanup {
                name: "x".into(),
                source: kube_error(),
            },
            Error::Serialise {
                what: "x".into(),
                source: serde_json::from_str::<u8>("no").expect_err("not a number"),
            },
            Error::Finalizer(Box::new(kube::runtime::finalizer::Error::UnnamedObject)),
        ];
        for error in &errors {
            assert!(
                ERROR_REASONS.contains(&error.reason()),
                "{}",
                error.reason()
            );
        }
        assert_eq!(errors.len(), ERROR_REASONS.len());
    }
}
