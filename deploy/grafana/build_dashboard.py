#!/usr/bin/env python3
"""Generates deploy/grafana/cairn.json, the Cairn Grafana dashboard.

The dashboard is code so that every panel has a description and a consistent query style;
CI regenerates it and fails if the committed JSON drifted. Run: python3 build_dashboard.py
"""

import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
BSEL = SEL + ', boundary=~"$boundary"'
RATE = "$__rate_interval"

panels = []
next_id = [1]
y = [0]


def row(title):
    panels.append(
        {"type": "row", "id": next_id[0], "title": title, "collapsed": False, "panels": [], "gridPos": {"h": 1, "w": 24, "x": 0, "y": y[0]}}
    )
    next_id[0] += 1
    y[0] += 1


def panel(title, description, targets, unit="short", kind="timeseries", w=8, h=8, x=0, min_zero=True):
    defaults = {"unit": unit}
    if min_zero:
        defaults["min"] = 0
    p = {
        "type": kind,
        "id": next_id[0],
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": x, "y": y[0]},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}, "tooltip": {"mode": "multi", "sort": "desc"}}
        if kind == "timeseries"
        else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value", "graphMode": "area"},
        "targets": [
            {"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "range": True}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    next_id[0] += 1
    panels.append(p)
    return p


def line(*specs):
    """Places panels of one row side by side (each spec: kwargs of panel())."""
    x = 0
    height = 0
    for spec in specs:
        w = spec.pop("w", 24 // len(specs))
        panel(w=w, x=x, **spec)
        x += w
        height = max(height, spec.get("h", 8))
    y[0] += height


row("Throughput")
line(
    dict(
        title="Events committed /s",
        description="Events appended per second, by boundary (SaveEvents and SaveEventsV2 that committed).",
        targets=[(f"sum by (boundary) (rate(cairn_events_committed_total{{{BSEL}}}[{RATE}]))", "{{boundary}}")],
        unit="ops",
    ),
    dict(
        title="Writes committed /s",
        description="Committed write requests per second, by boundary. A write appends one or more events atomically.",
        targets=[(f"sum by (boundary) (rate(cairn_writes_committed_total{{{BSEL}}}[{RATE}]))", "{{boundary}}")],
        unit="reqps",
    ),
    dict(
        title="Reads /s",
        description="Read requests per second by method: GetEvents, GetLatestByCriteria, GetWriteContext, GetEventCount.",
        targets=[
            (
                f'sum by (method) (rate(cairn_grpc_requests_total{{{SEL}, method=~"orisun.EventStore/(GetEvents|GetLatestByCriteria|GetWriteContext)|orisun.Admin/GetEventCount"}}[{RATE}]))',
                "{{method}}",
            )
        ],
        unit="reqps",
    ),
)

row("Latency and errors")
line(
    dict(
        title="Write latency p50 / p99",
        description="Duration of SaveEventsV2 and SaveEvents, from request to response, as seen by the server.",
        targets=[
            (
                f'histogram_quantile(0.5, sum by (le) (rate(cairn_grpc_request_duration_seconds_bucket{{{SEL}, method=~"orisun.EventStore/SaveEvents(V2)?"}}[{RATE}])))',
                "p50",
            ),
            (
                f'histogram_quantile(0.99, sum by (le) (rate(cairn_grpc_request_duration_seconds_bucket{{{SEL}, method=~"orisun.EventStore/SaveEvents(V2)?"}}[{RATE}])))',
                "p99",
            ),
        ],
        unit="s",
    ),
    dict(
        title="Read latency p50 / p99",
        description="Duration of GetEvents and GetLatestByCriteria, by method.",
        targets=[
            (
                f'histogram_quantile(0.5, sum by (le, method) (rate(cairn_grpc_request_duration_seconds_bucket{{{SEL}, method=~"orisun.EventStore/(GetEvents|GetLatestByCriteria)"}}[{RATE}])))',
                "p50 {{method}}",
            ),
            (
                f'histogram_quantile(0.99, sum by (le, method) (rate(cairn_grpc_request_duration_seconds_bucket{{{SEL}, method=~"orisun.EventStore/(GetEvents|GetLatestByCriteria)"}}[{RATE}])))',
                "p99 {{method}}",
            ),
        ],
        unit="s",
    ),
    dict(
        title="Errors by code /s",
        description="Requests per second that ended in a status other than OK, by gRPC code. ALREADY_EXISTS on writes is a CCC conflict (expected under contention); INTERNAL, UNKNOWN, DATA_LOSS and UNAVAILABLE are server-side.",
        targets=[(f'sum by (code) (rate(cairn_grpc_requests_total{{{SEL}, code!="OK"}}[{RATE}]))', "{{code}}")],
        unit="reqps",
    ),
)
line(
    dict(
        title="CCC conflict ratio",
        description="Share of conditional-or-not writes refused because an observed context moved (ALREADY_EXISTS), by boundary. High values mean contended contexts: clients retry more.",
        targets=[
            (
                f"sum by (boundary) (rate(cairn_ccc_conflicts_total{{{BSEL}}}[{RATE}])) / (sum by (boundary) (rate(cairn_ccc_conflicts_total{{{BSEL}}}[{RATE}])) + sum by (boundary) (rate(cairn_writes_committed_total{{{BSEL}}}[{RATE}])))",
                "{{boundary}}",
            )
        ],
        unit="percentunit",
    ),
    dict(
        title="Raft commit latency p99",
        description="Time from proposing a command to Raft until it is applied (includes the fsync of the log).",
        targets=[
            (f"histogram_quantile(0.99, sum by (le, instance) (rate(cairn_raft_write_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "{{instance}}"),
        ],
        unit="s",
    ),
    dict(
        title="Authentication failures /s",
        description="Failed authentications by reason: missing, malformed, bad_password, bad_token.",
        targets=[(f"sum by (reason) (rate(cairn_auth_failures_total{{{SEL}}}[{RATE}]))", "{{reason}}")],
        unit="reqps",
    ),
)

row("Raft")
line(
    dict(
        title="Leader",
        description="1 on the node that currently leads its Raft group. Exactly one node per group should show 1.",
        targets=[(f"cairn_raft_is_leader{{{SEL}}}", "{{instance}}")],
        kind="stat",
    ),
    dict(
        title="Term and leader changes",
        description="Current Raft term, and leader changes seen in the last hour. A climbing term means elections.",
        targets=[
            (f"max(cairn_raft_term{{{SEL}}})", "term"),
            (f"sum(increase(cairn_raft_leader_changes_total{{{SEL}}}[1h]))", "leader changes (1h)"),
        ],
        kind="stat",
    ),
    dict(
        title="Replication lag",
        description="Log entries each follower is behind the leader (reported by the leader).",
        targets=[(f"max by (peer) (cairn_raft_replication_lag_entries{{{SEL}}})", "peer {{peer}}")],
    ),
)
line(
    dict(
        title="Apply lag",
        description="Log entries appended to a node's Raft log but not yet applied to its state machine.",
        targets=[(f"cairn_raft_last_log_index{{{SEL}}} - cairn_raft_applied_index{{{SEL}}}", "{{instance}}")],
    ),
    dict(
        title="Batch sizes",
        description="Writes folded into one proposed log entry (group commit, p50) and log entries applied per state-machine batch (p50 and p99). Larger batches mean more concurrent writes folded together.",
        targets=[
            (f"histogram_quantile(0.5, sum by (le) (rate(cairn_raft_proposal_commands_bucket{{{SEL}}}[{RATE}])))", "writes per entry p50"),
            (f"histogram_quantile(0.5, sum by (le) (rate(cairn_apply_batch_entries_bucket{{{SEL}}}[{RATE}])))", "entries per apply p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(cairn_apply_batch_entries_bucket{{{SEL}}}[{RATE}])))", "entries per apply p99"),
        ],
    ),
    dict(
        title="Apply latency p99",
        description="Time to apply one batch of committed entries (CCC checks, event and index writes).",
        targets=[(f"histogram_quantile(0.99, sum by (le, instance) (rate(cairn_apply_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "{{instance}}")],
        unit="s",
    ),
)
line(
    dict(
        title="Snapshots",
        description="Raft snapshots built (log compaction) and installed (a lagging node catching up) per hour.",
        targets=[
            (f"sum(increase(cairn_raft_snapshot_builds_total{{{SEL}}}[1h]))", "built (1h)"),
            (f"sum(increase(cairn_raft_snapshot_installs_total{{{SEL}}}[1h]))", "installed (1h)"),
            (f"sum(increase(cairn_raft_snapshot_chunks_sent_total{{{SEL}}}[1h]))", "chunks sent (1h)"),
        ],
        w=8,
    ),
    dict(
        title="Log, committed and applied index",
        description="Last Raft log index and last applied index per node, and the index a majority has stored (reported by the leader).",
        targets=[
            (f"cairn_raft_last_log_index{{{SEL}}}", "log {{instance}}"),
            (f"max(cairn_raft_committed_index{{{SEL}}})", "committed"),
            (f"cairn_raft_applied_index{{{SEL}}}", "applied {{instance}}"),
        ],
        w=16,
    ),
)

line(
    dict(
        title="Forwarded writes",
        description="Writes followers handed to the leader, by result: applied, rejected by the state machine (CCC conflicts included), or unavailable (no leader, or contact lost: outcome unknown to the client).",
        targets=[(f"sum by (result) (rate(cairn_forwarded_writes_total{{{SEL}}}[{RATE}]))", "{{result}}")],
        unit="ops",
        w=8,
    ),
    dict(
        title="Writes per forwarding message",
        description="Writes a follower sent to the leader in one message of its forwarding stream (every write waiting when it writes goes in one message).",
        targets=[(f"sum by (instance) (rate(cairn_forward_message_writes_sum{{{SEL}}}[{RATE}])) / sum by (instance) (rate(cairn_forward_message_writes_count{{{SEL}}}[{RATE}]))", "{{instance}}")],
        unit="short",
        w=8,
    ),
    dict(
        title="Follower read-index wait p99",
        description="Time a linearizable read on a follower waits for the leader's read index and for its own state machine to apply that far.",
        targets=[(f"histogram_quantile(0.99, sum by (le, instance) (rate(cairn_read_index_wait_seconds_bucket{{{SEL}}}[{RATE}])))", "{{instance}}")],
        unit="s",
        w=8,
    ),
)
line(
    dict(
        title="Planned entries applied /s",
        description="Entries whose appends the leader checked and turned into rows (pre-execution), applied on each node: held (rows written without checking again) or stale (the state changed since the plan; nothing written, the leader proposed the writes again). Stale plans beyond a leader change mean wasted work.",
        targets=[(f"sum by (instance, result) (rate(cairn_raft_planned_entries_applied_total{{{SEL}}}[{RATE}]))", "{{instance}} {{result}}")],
        unit="ops",
        w=8,
    ),
)

row("Subscriptions")
line(
    dict(
        title="Active subscriptions",
        description="Open catch-up subscriptions per node.",
        targets=[(f"cairn_subscriptions_active{{{SEL}}}", "{{instance}}")],
    ),
    dict(
        title="Subscription lag",
        description="Events the furthest-behind subscriber of each boundary still has to receive.",
        targets=[(f"max by (boundary) (cairn_subscription_lag_events{{{BSEL}}})", "{{boundary}}")],
    ),
    dict(
        title="Events delivered /s",
        description="Events sent to subscribers per second.",
        targets=[(f"sum(rate(cairn_subscription_events_sent_total{{{SEL}}}[{RATE}]))", "delivered")],
        unit="ops",
    ),
)

row("Storage")
line(
    dict(
        title="RocksDB size",
        description="Live SST file bytes and memtable bytes per node.",
        targets=[
            (f"cairn_rocksdb_live_sst_bytes{{{SEL}}}", "SST {{instance}}"),
            (f"cairn_rocksdb_memtable_bytes{{{SEL}}}", "memtables {{instance}}"),
        ],
        unit="bytes",
    ),
    dict(
        title="Pending compaction",
        description="Bytes RocksDB estimates compaction must rewrite. Writes slow down at 64 GiB and stop at 256 GiB.",
        targets=[(f"cairn_rocksdb_pending_compaction_bytes{{{SEL}}}", "{{instance}}")],
        unit="bytes",
    ),
    dict(
        title="Data volume free",
        description="Share of the data directory's filesystem still available.",
        targets=[(f"cairn_data_dir_available_bytes{{{SEL}}} / cairn_data_dir_capacity_bytes{{{SEL}}}", "{{instance}}")],
        unit="percentunit",
    ),
)

row("Backups")
line(
    dict(
        title="Last backup",
        description="Time since each node last streamed a whole backup (cairn backup create, to a directory or S3). CairnBackupMissing fires when no member has one younger than 25 hours. Kept across restarts.",
        targets=[(f"time() - (cairn_backup_last_success_timestamp_seconds{{{SEL}}} > 0)", "{{instance}}")],
        unit="s",
    ),
    dict(
        title="Backup size and duration",
        description="Size of the last whole backup of each node, and how long it took to stream.",
        targets=[
            (f"cairn_backup_bytes{{{SEL}}}", "bytes {{instance}}"),
            (f"cairn_backup_duration_seconds{{{SEL}}}", "seconds {{instance}}"),
        ],
    ),
    dict(
        title="Backups by result",
        description="Backups streamed per node in the last day: succeeded, client_gone (the client left before the manifest) or failed (the node could not take or read its checkpoint; it logs why).",
        targets=[(f"sum by (instance, result) (increase(cairn_backups_total{{{SEL}}}[1d]))", "{{instance}} {{result}}")],
    ),
)
line(
    dict(
        title="Archive lag",
        description="Age of the oldest committed log entry not yet in the archive (--archive-to), as the archiving leader sees it (0 on the other members). CairnArchiveLagging fires above 5 minutes.",
        targets=[(f"cairn_archive_lag_seconds{{{SEL}}}", "{{instance}}")],
        unit="s",
    ),
    dict(
        title="Archive segments",
        description="Segments uploaded per node in the last hour, by result (failed: the node logs why), and gaps: entries no member still had when their turn came (restores into a gap are refused; take a base backup).",
        targets=[
            (f"sum by (instance, result) (increase(cairn_archive_segments_total{{{SEL}}}[1h]))", "{{instance}} {{result}}"),
            (f"sum by (instance) (increase(cairn_archive_gaps_total{{{SEL}}}[1h]))", "gaps {{instance}}"),
        ],
    ),
    dict(
        title="Archived index",
        description="Highest Raft log index the archive holds, as each node knows it, beside the index it has applied.",
        targets=[
            (f"cairn_archive_index{{{SEL}}}", "archived {{instance}}"),
            (f"cairn_raft_applied_index{{{SEL}}}", "applied {{instance}}"),
        ],
    ),
)

row("TLS")
line(
    dict(
        title="Certificate expires in",
        description="Time until the certificate each node serves (and the client CA it trusts) expires. Renewed files reach a node within --tls-reload-secs; CairnCertificateExpiresSoon fires below 14 days. Empty without --tls-cert.",
        targets=[(f"cairn_tls_certificate_expiry_timestamp_seconds{{{SEL}}} - time()", "{{instance}} {{certificate}}")],
        unit="s",
    ),
    dict(
        title="Certificate reloads",
        description="Changed TLS files loaded, or failed (unusable: the last good certificate stays in use; the node logs why).",
        targets=[(f"sum by (instance, result) (increase(cairn_tls_reloads_total{{{SEL}}}[1h]))", "{{instance}} {{result}}")],
    ),
    dict(
        title="TLS handshake failures /s",
        description="Handshakes that failed or timed out, per port: plaintext clients, untrusted or missing client certificates, scanners.",
        targets=[(f"sum by (instance, port) (rate(cairn_tls_handshake_failures_total{{{SEL}}}[{RATE}]))", "{{instance}} {{port}}")],
        unit="ops",
    ),
)


# The operator's own series (cairn-operator's /metrics, its own scrape job): not filtered by
# the node variables above; empty where the operator is not scraped.
row("Operator")
line(
    dict(
        title="Reconciles",
        description="Reconciles of Boundaries per second across operator replicas, and failed ones by reason (read, apply, status, cleanup, serialise, finalizer). Sustained errors fire CairnOperatorReconcileErrors.",
        targets=[
            (f"sum(rate(cairn_operator_reconciles_total[{RATE}]))", "reconciles"),
            (f"sum by (reason) (rate(cairn_operator_reconcile_errors_total[{RATE}])) > 0", "errors {{reason}}"),
        ],
        unit="ops",
    ),
    dict(
        title="Reconcile duration",
        description="Median and 99th percentile of one reconcile (API reads and patches, and the calls to each node's cluster API).",
        targets=[
            (f"histogram_quantile(0.5, sum by (le) (rate(cairn_operator_reconcile_duration_seconds_bucket[{RATE}])))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(cairn_operator_reconcile_duration_seconds_bucket[{RATE}])))", "p99"),
        ],
        unit="s",
    ),
    dict(
        title="Operator leader",
        description="1 for the operator replica that holds the leader Lease and reconciles; standbys show 0. No replica at 1 for 5 minutes fires CairnOperatorNoLeader.",
        targets=[("cairn_operator_leader", "{{instance}}")],
    ),
)

def variable(name, label, query, description, multi=True):
    v = {
        "type": "query",
        "name": name,
        "label": label,
        "description": description,
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*",
        "sort": 1,
    }
    if multi:
        v["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return v


dashboard = {
    "title": "Cairn",
    "uid": "cairn-overview",
    "description": "Cairn event database: throughput, latency, CCC conflicts, Raft, subscriptions and storage.",
    "tags": ["cairn", "event-store"],
    "schemaVersion": 39,
    "version": 1,
    "editable": True,
    "graphTooltip": 1,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "timezone": "browser",
    "annotations": {"list": []},
    "links": [],
    "templating": {
        "list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Data source",
                "description": "Prometheus that scrapes Cairn's /metrics.",
                "query": "prometheus",
                "hide": 0,
            },
            variable("job", "Job", "label_values(cairn_raft_term, job)", "Scrape job of the Cairn nodes (one per Boundary cluster)."),
            variable("instance", "Node", 'label_values(cairn_raft_term{job=~"$job"}, instance)', "Cairn nodes to show."),
            variable("boundary", "Boundary", 'label_values(cairn_events_committed_total{job=~"$job"}, boundary)', "Boundaries to show in per-boundary panels."),
        ]
    },
    "panels": panels,
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cairn.json")
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2, sort_keys=False)
    f.write("\n")
