//! Tower middleware in front of every gRPC service: request metrics, a tracing span,
//! authentication and role checks (A1, A3), and the `x-auth-token` response header.
//!
//! Doing this once, outside the handlers, means no handler can forget to authenticate and
//! every response (success, error, stream) is counted with its final status code. A handler
//! that panics answers INTERNAL here: the bug costs one request, not the connection's other
//! streams, and the node keeps serving.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Code;
use tonic::body::Body;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::auth::{TOKEN_HEADER, is_public, required_roles};
use crate::metrics::{Metrics, RequestTimer, method_label};
use crate::rpc::NODE_STARTING;
use crate::state::Ready;

/// Layer producing [`GrpcMiddleware`].
#[derive(Clone)]
pub struct GrpcLayer {
    ready: Ready,
    metrics: Arc<Metrics>,
}

impl GrpcLayer {
    /// A layer over the node's state slot and metrics.
    pub fn new(ready: Ready, metrics: Arc<Metrics>) -> Self {
        GrpcLayer { ready, metrics }
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = GrpcMiddleware<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMiddleware {
            inner,
            ready: self.ready.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct GrpcMiddleware<S> {
    inner: S,
    ready: Ready,
    metrics: Arc<Metrics>,
}

fn status_response(status: tonic::Status) -> Response<Body> {
    status.into_http()
}

fn header_code(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from)
}

impl<S> Service<Request<Body>> for GrpcMiddleware<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let ready = self.ready.clone();
        let metrics = self.metrics.clone();
        let path = req.uri().path().to_string();
        let method = method_label(&path);
        let span = tracing::info_span!(
            "grpc",
            method,
            node_id = tracing::field::Empty,
            user = tracing::field::Empty,
            boundary = tracing::field::Empty
        );
        let handled = async move {
            let mut timer = metrics.request(method);
            if is_public(&path) {
                let response = inner.call(req).await?;
                return Ok(observe(response, timer));
            }
            let Some(node) = ready.get().cloned() else {
                timer.set_code(Code::Unavailable);
                return Ok(status_response(cairn_proto::to_status(
                    cairn_core::Error::Unavailable(NODE_STARTING.to_string()),
                )));
            };
            tracing::Span::current().record("node_id", node.raft.node_id());
            let addr = req
                .extensions()
                .get::<crate::listeners::ConnectionInfo>()
                .and_then(|info| info.remote_addr)
                .map(|a| a.ip());
            let mut authenticated = node.auth.authenticate(req.headers(), addr).await;
            if let Err((_, failure)) = &authenticated
                && failure.may_be_stale()
                && !node.raft.is_leader()
            {
                // A user, a password or a token made through another node may not have
                // reached this one yet: bring the catalog up to everything committed and
                // look again. (A leader has applied every change it acknowledged.)
                let failure = *failure;
                authenticated = match node.router.read_barrier().await {
                    Ok(()) => node.auth.authenticate(req.headers(), addr).await,
                    Err(e) => Err((e, failure)),
                };
            }
            let principal = match authenticated {
                Ok(p) => p,
                Err((error, failure)) => {
                    metrics
                        .auth_failures
                        .with_label_values(&[failure.label()])
                        .inc();
                    let status = cairn_proto::to_status(error);
                    timer.set_code(status.code());
                    return Ok(status_response(status));
                }
            };
            tracing::Span::current().record("user", principal.username.as_str());
            if let Some(roles) = required_roles(&path)
                && let Err(e) = principal.require(roles, method)
            {
                let status = cairn_proto::to_status(e);
                timer.set_code(status.code());
                return Ok(status_response(status));
            }
            let token = node.auth.issue_token(&principal);
            req.extensions_mut().insert(principal);
            let mut response = inner.call(req).await?;
            match token.map(|t| HeaderValue::from_str(&t)) {
                Ok(Ok(value)) => {
                    response.headers_mut().insert(TOKEN_HEADER, value);
                }
                Ok(Err(e)) => tracing::error!("failed to encode session token header: {e}"),
                Err(e) => tracing::warn!("failed to issue session token: {e}"),
            }
            Ok(observe(response, timer))
        };
        let panics = self.metrics.request_panics.clone();
        Box::pin(
            async move {
                match AssertUnwindSafe(handled).catch_unwind().await {
                    Ok(response) => response,
                    Err(panic) => {
                        panics.inc();
                        tracing::error!(
                            "request handler panicked (a bug; the request is answered INTERNAL, the node keeps serving): {}",
                            panic_message(&*panic)
                        );
                        Ok(status_response(tonic::Status::internal(PANIC_MESSAGE)))
                    }
                }
            }
            .instrument(span),
        )
    }
}

/// What a client sees when its request's handler panicked.
pub const PANIC_MESSAGE: &str = "internal error: the server failed while handling this request (its log says why); a write may or may not have been applied";

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Records the final status code: from the headers of a trailers-only response, else from
/// the trailers when the body ends, else CANCELLED if the body is dropped unfinished.
fn observe(response: Response<Body>, mut timer: RequestTimer) -> Response<Body> {
    if let Some(code) = header_code(response.headers()) {
        timer.set_code(code);
        return response;
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(ObservedBody {
            inner: body,
            timer: Some(timer),
        }),
    )
}

struct ObservedBody {
    inner: Body,
    timer: Option<RequestTimer>,
}

impl HttpBody for ObservedBody {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(code) = frame.trailers_ref().and_then(header_code)
            && let Some(mut timer) = self.timer.take()
        {
            timer.set_code(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;

    /// A service that panics on the first call and answers OK afterwards, standing in for a
    /// handler with a bug.
    #[derive(Clone)]
    struct PanicsOnce(Arc<std::sync::atomic::AtomicBool>);

    impl Service<Request<Body>> for PanicsOnce {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<'static, Result<Response<Body>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            let first = !self.0.swap(true, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                assert!(!first, "a handler bug");
                Ok(tonic::Status::ok("fine").into_http())
            })
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_internal_and_the_next_call_is_served() {
        let metrics = Arc::new(Metrics::new().expect("registry"));
        let layer = GrpcLayer::new(Arc::new(OnceLock::new()), metrics.clone());
        let mut service = layer.layer(PanicsOnce(Default::default()));
        // Health is public: the call reaches the inner service without a node.
        let path = "/grpc.health.v1.Health/Check";
        let request = || {
            Request::builder()
                .uri(path)
                .body(Body::empty())
                .expect("request")
        };
        let first = service.call(request()).await.expect("infallible");
        assert_eq!(header_code(first.headers()), Some(Code::Internal));
        let second = service.call(request()).await.expect("infallible");
        assert_eq!(header_code(second.headers()), Some(Code::Ok));
        assert_eq!(metrics.request_panics.get(), 1);
        let label = method_label(path);
        assert_eq!(
            metrics
                .grpc_requests
                .with_label_values(&[label, "INTERNAL"])
                .get(),
            1,
            "the panicked request is counted as INTERNAL"
        );
    }
}
