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

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.serving.load(Ordering::Acquire) && state.ready.get().is_some() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
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
