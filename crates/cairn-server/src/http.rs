//! The HTTP side port: `/healthz` (the process is up), `/readyz` (the node serves requests)
//! and `/metrics` (Prometheus text exposition).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;
use crate::state::Ready;

/// What the HTTP handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// Node slot.
    pub ready: Ready,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// False before start-up completes and once shutdown begins.
    pub serving: Arc<AtomicBool>,
}

/// Why the node cannot go on, if it cannot: Raft stopped on a storage error.
fn fatal(state: &HttpState) -> Option<String> {
    state.ready.get().and_then(|node| node.raft.fatal())
}

async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    // Liveness: a node whose Raft stopped is alive but useless; failing the probe makes
    // Kubernetes restart it (the process also exits on its own, see `cli`).
    match fatal(&state) {
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("raft stopped: {why}\n"),
        ),
        None => (StatusCode::OK, "ok\n".to_string()),
    }
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if let Some(why) = fatal(&state) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: raft stopped: {why}\n"),
        );
    }
    if state.serving.load(Ordering::Acquire) && state.ready.get().is_some() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string())
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    if let Some(node) = state.ready.get() {
        let (live, pending, memtables) = node.store().size_stats();
        let m = &state.metrics;
        m.rocksdb_live_sst_bytes.set(live as i64);
        m.rocksdb_pending_compaction_bytes.set(pending as i64);
        m.rocksdb_memtable_bytes.set(memtables as i64);
        m.subscription_lag.reset();
        for (boundary, lag) in node.subscriptions.max_lag_by_boundary() {
            m.subscription_lag
                .with_label_values(&[&boundary])
                .set(lag as i64);
        }
        match rustix::fs::statvfs(&node.config.data_dir) {
            Ok(fs) => {
                m.data_dir_available_bytes
                    .set(fs.f_bavail.saturating_mul(fs.f_frsize) as i64);
                m.data_dir_capacity_bytes
                    .set(fs.f_blocks.saturating_mul(fs.f_frsize) as i64);
            }
            Err(e) => tracing::warn!(
                "failed to read filesystem stats of {}: {e}",
                node.config.data_dir.display()
            ),
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}
