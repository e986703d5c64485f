//! The node's Prometheus metrics: one registry, families registered at start-up and passed
//! down. Labels come from enums (gRPC codes, auth failure kinds), never from free text.

use std::sync::Arc;
use std::time::Instant;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tonic::Code;

pub use cairn_proto::status::code_name as code_label;

/// Metric families of a node.
pub struct Metrics {
    registry: Registry,
    /// gRPC requests by method and code.
    pub grpc_requests: IntCounterVec,
    /// gRPC request duration by method and code (seconds).
    pub grpc_duration: HistogramVec,
    /// Committed writes per boundary.
    pub writes_committed: IntCounterVec,
    /// Committed events per boundary.
    pub events_committed: IntCounterVec,
    /// CCC conflicts per boundary.
    pub conflicts: IntCounterVec,
    /// Authentication failures by kind.
    pub auth_failures: IntCounterVec,
    /// Request handlers that panicked (answered INTERNAL).
    pub request_panics: IntCounter,
    /// Connections closed at once because their port was at its connection limit.
    pub connections_refused: IntCounterVec,
    /// TLS handshakes that failed or timed out, by port.
    pub tls_handshake_failures: IntCounterVec,
    /// Expiry of the loaded TLS certificates (Unix seconds), by certificate.
    pub tls_certificate_expiry: IntGaugeVec,
    /// Reloads of changed TLS files, by result.
    pub tls_reloads: IntCounterVec,
    /// Open subscriptions.
    pub subscriptions_active: IntGauge,
    /// Events delivered to subscribers.
    pub subscription_events: IntCounter,
    /// Log entries the proposer submitted, by whether another was in flight.
    pub raft_proposals: IntCounterVec,
    /// Entries planned by their leader, applied here: rows written or stale.
    pub raft_planned_entries: IntCounterVec,
    /// Commands folded into one proposed entry.
    pub raft_proposal_commands: Histogram,
    /// Raft proposal latency (propose → applied), seconds.
    pub raft_write_duration: Histogram,
    /// Entries per state-machine apply batch.
    pub apply_batch_entries: Histogram,
    /// Duration of one apply batch, seconds.
    pub apply_duration: Histogram,
    /// Snapshots built.
    pub snapshot_builds: IntCounter,
    /// Snapshots installed from a leader.
    pub snapshot_installs: IntCounter,
    /// Log entries each peer is behind the leader.
    pub replication_lag: IntGaugeVec,
    /// Writes a follower handed to the leader, by result.
    pub forwarded_writes: IntCounterVec,
    /// Writes per message a follower sent on its forwarding stream.
    pub forward_message_writes: Histogram,
    /// Time a linearizable read on a follower waited for the leader's read index and for
    /// this node to apply that far, seconds.
    pub read_index_wait: Histogram,
    /// Snapshot chunks sent to followers.
    pub snapshot_chunks_sent: IntCounter,
    /// Positions the furthest-behind subscription of each boundary has not yet scanned.
    pub subscription_lag: IntGaugeVec,
    /// Backups this node streamed, by result.
    pub backups: IntCounterVec,
    /// When this node last streamed a whole backup (Unix seconds; 0: never). Kept in the
    /// data directory, so a restart does not forget it.
    pub backup_last_success: IntGauge,
    /// How long that backup took to stream (seconds).
    pub backup_duration: Gauge,
    /// How many bytes that backup held.
    pub backup_bytes: IntGauge,
    /// Age of the oldest committed entry the archive does not hold yet (the leader's
    /// view; 0 elsewhere and when archiving is off).
    pub archive_lag: Gauge,
    /// Highest log index the archive holds, as this node knows.
    pub archive_index: IntGauge,
    /// Archive segments this node uploaded, by result.
    pub archive_segments: IntCounterVec,
    /// Bytes of segments this node uploaded.
    pub archive_bytes: IntCounter,
    /// Times the archive got a gap: entries no member still had when it was their turn.
    pub archive_gaps: IntCounter,
    /// Bytes available to the node on the data directory's filesystem.
    pub data_dir_available_bytes: IntGauge,
    /// Size of the data directory's filesystem.
    pub data_dir_capacity_bytes: IntGauge,
    /// Current Raft term.
    pub raft_term: IntGauge,
    /// 1 while this node leads.
    pub raft_is_leader: IntGauge,
    /// Leader changes seen.
    pub raft_leader_changes: IntCounter,
    /// Index of the last entry in this node's Raft log.
    pub raft_last_log_index: IntGauge,
    /// Index of the last snapshot.
    pub raft_snapshot_index: IntGauge,
    /// Highest log index a quorum has stored (exported by the leader, labelled with its id).
    pub raft_committed_index: IntGaugeVec,
    /// Last applied log index.
    pub raft_applied_index: IntGauge,
    /// Live SST bytes.
    pub rocksdb_live_sst_bytes: IntGauge,
    /// Pending compaction bytes.
    pub rocksdb_pending_compaction_bytes: IntGauge,
    /// Memtable bytes.
    pub rocksdb_memtable_bytes: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Buckets of the batch-size histograms (writes per entry, entries per apply).
const BATCH_SIZE_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Latency buckets from 100µs to 10s.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

impl Metrics {
    /// Registers every family in a fresh registry.
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
            grpc_requests: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_grpc_requests_total",
                    "gRPC requests by method and status code"
                ),
                &["method", "code"]
            )?),
            grpc_duration: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "cairn_grpc_request_duration_seconds",
                    "gRPC request duration by method and status code (streams: their lifetime)"
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["method", "code"]
            )?),
            writes_committed: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_writes_committed_total",
                    "Committed writes (SaveEvents*) per boundary"
                ),
                &["boundary"]
            )?),
            events_committed: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_events_committed_total",
                    "Committed events per boundary"
                ),
                &["boundary"]
            )?),
            conflicts: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_ccc_conflicts_total",
                    "Writes rejected because an observed context moved (ALREADY_EXISTS), per boundary"
                ),
                &["boundary"]
            )?),
            auth_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_auth_failures_total",
                    "Failed authentications by kind"
                ),
                &["reason"]
            )?),
            request_panics: reg!(IntCounter::new(
                "cairn_grpc_request_panics_total",
                "Request handlers that panicked (a bug): each answered INTERNAL, the node kept serving"
            )?),
            connections_refused: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_connections_refused_total",
                    "Connections closed on accept because their port (client, peer, http) was at its connection limit"
                ),
                &["port"]
            )?),
            tls_handshake_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_tls_handshake_failures_total",
                    "TLS handshakes that failed or timed out (plaintext clients, unknown CAs, missing client certificates), by port"
                ),
                &["port"]
            )?),
            tls_certificate_expiry: reg!(IntGaugeVec::new(
                Opts::new(
                    "cairn_tls_certificate_expiry_timestamp_seconds",
                    "When the loaded TLS certificate expires (Unix seconds): serving (--tls-cert's leaf) or client_ca (the first of --tls-client-ca's to expire)"
                ),
                &["certificate"]
            )?),
            tls_reloads: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_tls_reloads_total",
                    "Changed TLS files: loaded (new connections get them) or failed (unusable, the previous ones kept)"
                ),
                &["result"]
            )?),
            subscriptions_active: reg!(IntGauge::new(
                "cairn_subscriptions_active",
                "Open catch-up subscriptions"
            )?),
            subscription_events: reg!(IntCounter::new(
                "cairn_subscription_events_sent_total",
                "Events delivered to subscribers"
            )?),
            raft_proposals: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_raft_proposals_total",
                    "Log entries proposed, by whether another was still in flight"
                ),
                &["overlapping"]
            )?),
            raft_planned_entries: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_raft_planned_entries_applied_total",
                    "Entries whose writes the leader checked and turned into rows, applied on \
                     this node: held (rows written) or stale (state changed since the plan; \
                     nothing written, the writes proposed again)"
                ),
                &["result"]
            )?),
            raft_proposal_commands: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_raft_proposal_commands",
                    "Writes folded into one proposed log entry (group commit)"
                )
                .buckets(BATCH_SIZE_BUCKETS.to_vec())
            )?),
            raft_write_duration: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_raft_write_duration_seconds",
                    "Time from proposing a command to its application"
                )
                .buckets(LATENCY_BUCKETS.to_vec())
            )?),
            apply_batch_entries: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_apply_batch_entries",
                    "Committed log entries applied per state-machine batch"
                )
                .buckets(BATCH_SIZE_BUCKETS.to_vec())
            )?),
            apply_duration: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_apply_duration_seconds",
                    "Time to apply one batch of committed entries"
                )
                .buckets(LATENCY_BUCKETS.to_vec())
            )?),
            snapshot_builds: reg!(IntCounter::new(
                "cairn_raft_snapshot_builds_total",
                "Raft snapshots built (log compaction)"
            )?),
            snapshot_installs: reg!(IntCounter::new(
                "cairn_raft_snapshot_installs_total",
                "Raft snapshots installed from the leader"
            )?),
            replication_lag: reg!(IntGaugeVec::new(
                Opts::new(
                    "cairn_raft_replication_lag_entries",
                    "Log entries a peer is behind this leader (leaders only)"
                ),
                &["peer"]
            )?),
            forwarded_writes: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_forwarded_writes_total",
                    "Writes this follower forwarded to the leader, by result (applied, rejected, unavailable)"
                ),
                &["result"]
            )?),
            forward_message_writes: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_forward_message_writes",
                    "Writes a follower sent to the leader in one forwarding-stream message"
                )
                .buckets(BATCH_SIZE_BUCKETS.to_vec())
            )?),
            read_index_wait: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "cairn_read_index_wait_seconds",
                    "Time a follower's linearizable read waited for the leader's read index and its own apply"
                )
                .buckets(LATENCY_BUCKETS.to_vec())
            )?),
            snapshot_chunks_sent: reg!(IntCounter::new(
                "cairn_raft_snapshot_chunks_sent_total",
                "Snapshot chunks sent to followers that lag behind the log"
            )?),
            subscription_lag: reg!(IntGaugeVec::new(
                Opts::new(
                    "cairn_subscription_lag_events",
                    "Positions the furthest-behind subscription of a boundary has yet to scan"
                ),
                &["boundary"]
            )?),
            backups: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_backups_total",
                    "Backups this node streamed, by result: succeeded (every file and the manifest handed to the client's connection), client_gone (the client left before the manifest), failed (the node could not take or read its checkpoint)"
                ),
                &["result"]
            )?),
            backup_last_success: reg!(IntGauge::new(
                "cairn_backup_last_success_timestamp_seconds",
                "When this node last streamed a whole backup (Unix seconds, kept across restarts; 0 if it never has)"
            )?),
            backup_duration: reg!(Gauge::new(
                "cairn_backup_duration_seconds",
                "How long the last whole backup of this node took to stream, in seconds"
            )?),
            backup_bytes: reg!(IntGauge::new(
                "cairn_backup_bytes",
                "Size of the last whole backup of this node, in bytes"
            )?),
            archive_lag: reg!(Gauge::new(
                "cairn_archive_lag_seconds",
                "Age of the oldest committed log entry not yet in the archive, in seconds (exported by the archiving leader; 0 on other members and when everything is archived)"
            )?),
            archive_index: reg!(IntGauge::new(
                "cairn_archive_index",
                "Highest Raft log index the archive holds, as this node knows it"
            )?),
            archive_segments: reg!(IntCounterVec::new(
                Opts::new(
                    "cairn_archive_segments_total",
                    "Archive segments this node uploaded, by result (succeeded, failed)"
                ),
                &["result"]
            )?),
            archive_bytes: reg!(IntCounter::new(
                "cairn_archive_bytes_total",
                "Bytes of archive segments this node uploaded"
            )?),
            archive_gaps: reg!(IntCounter::new(
                "cairn_archive_gaps_total",
                "Gaps in the archive: committed entries no longer on this node when it was to archive them (restores to positions in a gap are refused; take a base backup)"
            )?),
            data_dir_available_bytes: reg!(IntGauge::new(
                "cairn_data_dir_available_bytes",
                "Bytes available on the data directory's filesystem"
            )?),
            data_dir_capacity_bytes: reg!(IntGauge::new(
                "cairn_data_dir_capacity_bytes",
                "Size of the data directory's filesystem in bytes"
            )?),
            raft_term: reg!(IntGauge::new("cairn_raft_term", "Current Raft term")?),
            raft_is_leader: reg!(IntGauge::new(
                "cairn_raft_is_leader",
                "1 if this node is the leader"
            )?),
            raft_leader_changes: reg!(IntCounter::new(
                "cairn_raft_leader_changes_total",
                "Leader changes observed by this node"
            )?),
            raft_last_log_index: reg!(IntGauge::new(
                "cairn_raft_last_log_index",
                "Index of the last entry in this node's Raft log"
            )?),
            raft_committed_index: reg!(IntGaugeVec::new(
                Opts::new(
                    "cairn_raft_committed_index",
                    "Highest log index stored by a quorum (leaders only)"
                ),
                &["node"]
            )?),
            raft_snapshot_index: reg!(IntGauge::new(
                "cairn_raft_snapshot_index",
                "Last log index covered by this node's latest snapshot"
            )?),
            raft_applied_index: reg!(IntGauge::new(
                "cairn_raft_applied_index",
                "Last Raft log index applied to the state machine"
            )?),
            rocksdb_live_sst_bytes: reg!(IntGauge::new(
                "cairn_rocksdb_live_sst_bytes",
                "Bytes in live RocksDB SST files"
            )?),
            rocksdb_pending_compaction_bytes: reg!(IntGauge::new(
                "cairn_rocksdb_pending_compaction_bytes",
                "RocksDB's estimate of bytes compaction must rewrite"
            )?),
            rocksdb_memtable_bytes: reg!(IntGauge::new(
                "cairn_rocksdb_memtable_bytes",
                "Bytes in RocksDB memtables"
            )?),
            registry,
        };
        #[cfg(target_os = "linux")]
        metrics.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(metrics)
    }

    /// The text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("failed to encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Starts timing a request; the timer records when dropped or finished.
    pub fn request(self: &Arc<Self>, method: &'static str) -> RequestTimer {
        RequestTimer {
            metrics: self.clone(),
            method,
            start: Instant::now(),
            code: None,
        }
    }
}

impl cairn_raft::RaftObserver for Metrics {
    fn proposed(&self, commands: usize, overlapping: bool) {
        self.raft_proposals
            .with_label_values(&[if overlapping { "true" } else { "false" }])
            .inc();
        self.raft_proposal_commands.observe(commands as f64);
    }

    fn applied(&self, entries: usize, elapsed: std::time::Duration) {
        self.apply_batch_entries.observe(entries as f64);
        self.apply_duration.observe(elapsed.as_secs_f64());
    }

    fn snapshot_built(&self) {
        self.snapshot_builds.inc();
    }

    fn snapshot_installed(&self) {
        self.snapshot_installs.inc();
    }

    fn plan_applied(&self, held: bool) {
        self.raft_planned_entries
            .with_label_values(&[if held { "held" } else { "stale" }])
            .inc();
    }
}

/// The method label of a request path: `Service/Method` for served methods, else
/// `unknown`, so the label has bounded cardinality whatever paths clients send.
pub fn method_label(path: &str) -> &'static str {
    crate::methods::lookup(path).map_or("unknown", |m| m.path.trim_start_matches('/'))
}

/// Records one request's duration and code when dropped (an unfinished timer counts as
/// CANCELLED: the client went away mid-request; INTERNAL when its handler panicked).
pub struct RequestTimer {
    metrics: Arc<Metrics>,
    method: &'static str,
    start: Instant,
    code: Option<Code>,
}

impl RequestTimer {
    /// Sets the outcome; recorded when the timer is dropped.
    pub fn set_code(&mut self, code: Code) {
        self.code = Some(code);
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        // Dropped while unwinding: the handler panicked, and the client is answered INTERNAL.
        let code = self.code.unwrap_or(if std::thread::panicking() {
            Code::Internal
        } else {
            Code::Cancelled
        });
        self.metrics
            .grpc_requests
            .with_label_values(&[self.method, code_label(code)])
            .inc();
        self.metrics
            .grpc_duration
            .with_label_values(&[self.method, code_label(code)])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(
            method_label("/orisun.EventStore/SaveEventsV2"),
            "orisun.EventStore/SaveEventsV2"
        );
        assert_eq!(method_label("/evil/\u{0}"), "unknown");
    }

    #[test]
    fn timer_counts_on_drop() {
        let m = Arc::new(Metrics::new().expect("registry"));
        {
            let mut t = m.request("orisun.EventStore/Ping");
            t.set_code(Code::Ok);
        }
        drop(m.request("orisun.EventStore/Ping"));
        assert_eq!(
            m.grpc_requests
                .with_label_values(&["orisun.EventStore/Ping", "OK"])
                .get(),
            1
        );
        assert_eq!(
            m.grpc_requests
                .with_label_values(&["orisun.EventStore/Ping", "CANCELLED"])
                .get(),
            1
        );
        assert!(
            m.render()
                .contains("cairn_grpc_request_duration_seconds_bucket")
        );
    }
}
