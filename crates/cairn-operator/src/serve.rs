//! The operator process: the HTTP side port (`/healthz`, `/metrics`), leader election, and
//! the controller, which runs only while this process leads.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::controller::{self, Context};
use crate::leader::{Elector, LeaseConfig, LostLease};
use crate::metrics::Metrics;
use crate::validate::OperatorDefaults;

/// What `cairn-operator run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Operator-wide defaults for Boundaries.
    pub defaults: OperatorDefaults,
    /// Watch only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// Leader election (none: this process always reconciles; run one replica then).
    pub election: Option<LeaseConfig>,
}

/// Why the operator stopped other than by being asked to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The metric families could not be registered.
    #[error("failed to register the metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The API server could not be reached at start-up.
    #[error("failed to reach the API server: {0}")]
    Discover(#[source] controller::Error),
    /// The HTTP side port failed.
    #[error("the HTTP server on {addr} failed: {source}")]
    Http {
        /// Where it listened.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// Another operator leads now, or the Lease could not be renewed: this process stops
    /// so that, restarted, it competes again rather than reconcile beside another leader.
    #[error("lost the leader Lease: {0}")]
    LostLease(#[from] LostLease),
}

/// Runs the operator until `shutdown` is cancelled (then it finishes the reconciles under
/// way and releases the Lease) or leadership is lost (an error). `listener` serves
/// `/healthz` and `/metrics` for the whole life of the process, leading or standing by.
pub async fn run(
    client: Client,
    options: RunOptions,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::new()?);
    let http_addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let http = tokio::spawn(
        axum::serve(listener, router(metrics.clone()))
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
    );
    let result = lead_and_reconcile(client, options, metrics, shutdown.clone()).await;
    // Leadership lost: stop serving too, the process is about to exit.
    shutdown.cancel();
    match http.await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => {
            return Err(RunError::Http {
                addr: http_addr,
                source,
            });
        }
        Err(e) => tracing::error!("the HTTP server task failed: {e}"),
    }
    result
}

async fn lead_and_reconcile(
    client: Client,
    options: RunOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let context = Context::discover(client.clone(), options.defaults, metrics.clone())
        .await
        .map_err(RunError::Discover)?;
    let mut elector = options
        .election
        .map(|config| Elector::new(client, config, metrics.clone()));
    match &mut elector {
        Some(elector) => {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = elector.acquire() => {}
            }
        }
        None => metrics.leader.set(1),
    }
    tracing::info!(
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        "reconciling Boundaries"
    );
    let controller = controller::run(
        Arc::new(context),
        options.namespace,
        shutdown.clone().cancelled_owned(),
    );
    match &mut elector {
        None => {
            controller.await;
            Ok(())
        }
        Some(elector) => {
            tokio::select! {
                () = controller => {
                    elector.release().await;
                    Ok(())
                }
                lost = elector.hold() => {
                    tracing::error!("lost the leader Lease, stopping: {lost}");
                    Err(lost.into())
                }
            }
        }
    }
}

fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(render_metrics))
        .with_state(metrics)
}

/// The process is up and its loops run (a leader that cannot renew exits instead).
async fn healthz() -> &'static str {
    "ok\n"
}

async fn render_metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
}

/// Binds the HTTP side port, saying which flag to change when it is taken.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Http {
            addr: addr.to_string(),
            source,
        })
}
