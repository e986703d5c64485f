//! The reconcile's conversation with the API server, against a scripted mock (tower-test):
//! which requests, in which order, and what an error answer does. The real API server runs
//! in `tests/tests/operator/`.

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

use super::*;

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn context(pdb_v1: bool) -> (Arc<Context>, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "shop");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let context = Context {
        client,
        defaults: OperatorDefaults {
            image: "cairn:test".into(),
            network_policy: None,
        },
        capabilities: Capabilities::default(),
        pdb_v1,
        recorder,
        metrics: Arc::new(crate::metrics::Metrics::new().expect("register metrics")),
    };
    (Arc::new(context), handle)
}

fn boundary(spec: Value) -> Arc<Boundary> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1alpha1",
            "kind": "Boundary",
            "metadata": {
                "name": "orders",
                "namespace": "shop",
                "uid": "uid-1",
                "generation": 1,
                "finalizers": [FINALIZER],
            },
            "spec": spec,
        }))
        .expect("boundary"),
    )
}

fn not_found() -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

fn failure(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason}),
    )
}

/// Answers the next request, which must be `method path`, with `answer(its JSON body)`;
/// returns that body (Null when empty).
async fn expect(
    handle: &mut ApiHandle,
    method: &str,
    path: &str,
    answer: impl FnOnce(&Value) -> (u16, Value),
) -> Value {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request; expected {method} {path}"))
        .expect("the client went away");
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        (method, path),
        "request out of order"
    );
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .expect("request body");
    let sent = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let (status, body) = answer(&sent);
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response"),
    );
    sent
}

/// What a create or an apply answers: the object as sent.
fn echo(sent: &Value) -> (u16, Value) {
    (200, sent.clone())
}

/// What a status patch answers: the Boundary.
fn stored_boundary(_: &Value) -> (u16, Value) {
    let boundary = boundary(json!({}));
    (200, serde_json::to_value(&*boundary).expect("json"))
}

async fn expect_no_more(handle: &mut ApiHandle) {
    if let Ok(Some((request, _))) =
        tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await
    {
        panic!(
            "unexpected request {} {}",
            request.method(),
            request.uri().path()
        );
    }
}

const NS: &str = "/api/v1/namespaces/shop";
const APPS: &str = "/apis/apps/v1/namespaces/shop";
const STATUS: &str = "/apis/cairn.dev/v1alpha1/namespaces/shop/boundaries/orders/status";

/// Dereference of a Boundary nothing was applied for yet.
async fn dereference_nothing(handle: &mut ApiHandle) {
    expect(
        handle,
        "GET",
        &format!("{NS}/configmaps/orders-config"),
        |_| not_found(),
    )
    .await;
    expect(
        handle,
        "GET",
        &format!("{APPS}/statefulsets/orders"),
        |_| not_found(),
    )
    .await;
    expect(
        handle,
        "GET",
        &format!("{NS}/secrets/orders-cluster"),
        |_| not_found(),
    )
    .await;
}

#[tokio::test]
async fn a_new_boundary_is_read_then_applied_in_order_and_its_status_written() {
    let (context, mut handle) = context(true);
    let reconcile = tokio::spawn(reconcile(boundary(json!({"replicas": 3})), context));

    dereference_nothing(&mut handle).await;
    // Generated secrets: looked up, created once.
    for name in ["orders-admin", "orders-cluster"] {
        expect(&mut handle, "GET", &format!("{NS}/secrets/{name}"), |_| {
            not_found()
        })
        .await;
        let created = expect(&mut handle, "POST", &format!("{NS}/secrets"), echo).await;
        assert_eq!(created["metadata"]["name"], name);
        assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    }
    for path in [
        format!("{NS}/configmaps/orders-config"),
        format!("{NS}/services/orders-peers"),
        format!("{NS}/services/orders"),
    ] {
        let sent = expect(&mut handle, "PATCH", &path, echo).await;
        assert_eq!(sent["metadata"]["ownerReferences"][0]["kind"], "Boundary");
    }
    let set = expect(
        &mut handle,
        "PATCH",
        &format!("{APPS}/statefulsets/orders"),
        echo,
    )
    .await;
    assert_eq!(set["spec"]["replicas"], 3);
    let pdb = expect(
        &mut handle,
        "PATCH",
        "/apis/policy/v1/namespaces/shop/poddisruptionbudgets/orders",
        echo,
    )
    .await;
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let status = expect(&mut handle, "PATCH", STATUS, stored_boundary).await;
    assert_eq!(status["status"]["phase"], "Provisioning");
    assert_eq!(status["status"]["observedGeneration"], 1);

    let action = reconcile.await.expect("task").expect("reconciled");
    assert_eq!(action, Action::requeue(MEMBERSHIP_POLL), "not settled yet");
    expect_no_more(&mut handle).await;
}

#[tokio::test]
async fn a_server_without_policy_v1_gets_its_budget_as_v1beta1() {
    let (context, mut handle) = context(false);
    let reconcile = tokio::spawn(reconcile(boundary(json!({"replicas": 5})), context));
    dereference_nothing(&mut handle).await;
    for name in ["orders-admin", "orders-cluster"] {
        // Already there (another reconcile made them): never overwritten.
        expect(&mut handle, "GET", &format!("{NS}/secrets/{name}"), |_| {
            (
                200,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}),
            )
        })
        .await;
    }
    for path in [
        "configmaps/orders-config",
        "services/orders-peers",
        "services/orders",
    ] {
        expect(&mut handle, "PATCH", &format!("{NS}/{path}"), echo).await;
    }
    expect(
        &mut handle,
        "PATCH",
        &format!("{APPS}/statefulsets/orders"),
        echo,
    )
    .await;
    let pdb = expect(
        &mut handle,
        "PATCH",
        "/apis/policy/v1beta1/namespaces/shop/poddisruptionbudgets/orders",
        echo,
    )
    .await;
    assert_eq!(pdb["apiVersion"], "policy/v1beta1");
    assert_eq!(pdb["spec"]["maxUnavailable"], 2);
    expect(&mut handle, "PATCH", STATUS, stored_boundary).await;
    reconcile.await.expect("task").expect("reconciled");
}

#[tokio::test]
async fn a_secret_created_in_between_is_theirs_and_the_reconcile_goes_on() {
    let (context, mut handle) = context(true);
    let reconcile = tokio::spawn(reconcile(boundary(json!({})), context));
    dereference_nothing(&mut handle).await;
    expect(
        &mut handle,
        "GET",
        &format!("{NS}/secrets/orders-admin"),
        |_| not_found(),
    )
    .await;
    expect(&mut handle, "POST", &format!("{NS}/secrets"), |_| {
        failure(409, "AlreadyExists")
    })
    .await;
    expect(
        &mut handle,
        "GET",
        &format!("{NS}/secrets/orders-cluster"),
        |_| not_found(),
    )
    .await;
    expect(&mut handle, "POST", &format!("{NS}/secrets"), echo).await;
    expect(
        &mut handle,
        "PATCH",
        &format!("{NS}/configmaps/orders-config"),
        echo,
    )
    .await;
    // An error answer stops the pass: nothing after it is applied, no status is written,
    // and the error names what failed (the controller retries after RETRY).
    expect(
        &mut handle,
        "PATCH",
        &format!("{NS}/services/orders-peers"),
        |_| failure(500, "InternalError"),
    )
    .await;
    let error = reconcile
        .await
        .expect("task")
        .expect_err("the apply failed");
    assert_eq!(error.reason(), "apply");
    let text = error.to_string();
    assert!(
        text.contains("failed to apply Service orders-peers"),
        "{text}"
    );
    expect_no_more(&mut handle).await;
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_nothing_is_applied() {
    let (context, mut handle) = context(true);
    let reconcile = tokio::spawn(reconcile(boundary(json!({"replicas": 4})), context));
    dereference_nothing(&mut handle).await;
    let event = expect(
        &mut handle,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/shop/events",
        echo,
    )
    .await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "UnsupportedReplicas");
    let status = expect(&mut handle, "PATCH", STATUS, stored_boundary).await;
    assert_eq!(status["status"]["phase"], "Pending");
    let action = reconcile.await.expect("task").expect("reported");
    assert_eq!(action, Action::await_change());
    expect_no_more(&mut handle).await;
}

#[tokio::test]
async fn a_failed_read_fails_the_pass_before_anything_is_applied() {
    let (context, mut handle) = context(true);
    let reconcile = tokio::spawn(reconcile(boundary(json!({})), context));
    expect(
        &mut handle,
        "GET",
        &format!("{NS}/configmaps/orders-config"),
        |_| failure(403, "Forbidden"),
    )
    .await;
    let error = reconcile.await.expect("task").expect_err("forbidden");
    assert!(
        error
            .to_string()
            .contains("failed to read the ConfigMap orders-config"),
        "{error}"
    );
    expect_no_more(&mut handle).await;
}
