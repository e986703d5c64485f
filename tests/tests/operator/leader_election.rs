//! Several operator processes on one real API server: exactly one holds the Lease and
//! reconciles; a clean stop hands over at once; a crashed leader's Lease is respected until
//! it expires; a leader whose Lease is taken stops.

use std::net::SocketAddr;
use std::time::Duration;

use cairn_operator::Boundary;
use cairn_operator::leader::LeaseConfig;
use cairn_operator::serve::{self, RunError, RunOptions};
use cairn_operator::validate::OperatorDefaults;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Envtest, NAMESPACE, boundaries_raw, create_namespace, eventually, eventually_within, http_get,
    install_crd, manifest, metric,
};

const LEASE: &str = "cairn-operator";
const LEASE_DURATION: Duration = Duration::from_secs(10);

/// One operator process (in this test's runtime, with its own client and HTTP port).
struct Operator {
    http: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), RunError>>,
}

async fn start(envtest: &Envtest, identity: &str) -> Operator {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = listener.local_addr().expect("address");
    let shutdown = CancellationToken::new();
    let options = RunOptions {
        defaults: OperatorDefaults {
            image: "cairn:test".into(),
            network_policy: None,
        },
        namespace: Some(NAMESPACE.into()),
        election: Some(
            LeaseConfig {
                name: LEASE.into(),
                namespace: NAMESPACE.into(),
                identity: identity.into(),
                lease_duration: LEASE_DURATION,
                renew_deadline: Duration::from_secs(6),
                retry_period: Duration::from_millis(300),
            }
            .validate()
            .expect("valid timings"),
        ),
    };
    let task = tokio::spawn(serve::run(
        envtest.client().await,
        options,
        listener,
        shutdown.clone(),
    ));
    Operator {
        http,
        shutdown,
        task,
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

async fn reconciles(operator: &Operator) -> f64 {
    metric(
        &http_get(operator.http, "/metrics").await,
        "cairn_operator_reconciles_total",
    )
}

async fn reconciled(boundaries: &Api<Boundary>, name: &str) {
    eventually(&format!("a status on {name}"), || {
        let boundaries = boundaries.clone();
        async move { boundaries.get(name).await.ok()?.status?.phase }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest); run by .ci/run with --ignored"]
async fn one_operator_leads_and_a_standby_takes_over() {
    let envtest = Envtest::start();
    let client = envtest.client().await;
    install_crd(&client).await;
    create_namespace(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let boundaries: Api<Boundary> = Api::namespaced(client.clone(), NAMESPACE);
    let raw = boundaries_raw(&client);

    // Two replicas: one leads, the other stands by, both healthy.
    let mut a = Some(start(&envtest, "operator-a").await);
    let mut b = Some(start(&envtest, "operator-b").await);
    let first = eventually("a leader", || {
        let leases = leases.clone();
        async move { holder(&leases).await }
    })
    .await;
    let (leader, standby) = if first == "operator-a" {
        (a.take().expect("a"), b.take().expect("b"))
    } else {
        (b.take().expect("b"), a.take().expect("a"))
    };
    for (operator, leading) in [(&leader, 1.0), (&standby, 0.0)] {
        assert_eq!(http_get(operator.http, "/healthz").await, "ok\n");
        let metrics = http_get(operator.http, "/metrics").await;
        assert_eq!(metric(&metrics, "cairn_operator_leader"), leading);
    }

    // Only the leader reconciles.
    raw.create(
        &PostParams::default(),
        &manifest("orders", serde_json::json!({"replicas": 1})),
    )
    .await
    .expect("create a Boundary");
    reconciled(&boundaries, "orders").await;
    assert!(reconciles(&leader).await >= 1.0);
    assert_eq!(
        reconciles(&standby).await,
        0.0,
        "a standby must not reconcile"
    );

    // A clean stop releases the Lease: the standby takes over well before it would expire.
    leader.shutdown.cancel();
    leader
        .task
        .await
        .expect("leader task")
        .expect("a clean stop");
    let standby_id = if first == "operator-a" {
        "operator-b"
    } else {
        "operator-a"
    };
    eventually_within(
        "the standby to take over the released Lease",
        LEASE_DURATION / 2,
        || {
            let leases = leases.clone();
            async move { (holder(&leases).await? == standby_id).then_some(()) }
        },
    )
    .await;
    let metrics = http_get(standby.http, "/metrics").await;
    assert_eq!(metric(&metrics, "cairn_operator_leader"), 1.0);
    assert_eq!(
        metric(&metrics, "cairn_operator_leader_acquisitions_total"),
        1.0
    );
    raw.create(
        &PostParams::default(),
        &manifest("billing", serde_json::json!({"replicas": 1})),
    )
    .await
    .expect("create a second Boundary");
    reconciled(&boundaries, "billing").await;
    assert!(reconciles(&standby).await >= 1.0);

    // A crash (no release): a newcomer waits out the whole lease duration, on its own clock.
    standby.task.abort();
    let _ = standby.task.await;
    standby.shutdown.cancel();
    let crashed_at = Instant::now();
    let newcomer = start(&envtest, "operator-c").await;
    eventually_within("the newcomer to take over", LEASE_DURATION * 3, || {
        let leases = leases.clone();
        async move { (holder(&leases).await? == "operator-c").then_some(()) }
    })
    .await;
    let waited = crashed_at.elapsed();
    assert!(
        waited >= LEASE_DURATION - Duration::from_millis(500),
        "took a Lease renewed {waited:?} ago, within its duration {LEASE_DURATION:?}"
    );
    assert_eq!(
        leases
            .get(LEASE)
            .await
            .expect("Lease")
            .spec
            .expect("spec")
            .lease_transitions,
        Some(2),
        "a → standby → newcomer"
    );

    // A leader whose Lease someone else took stops instead of reconciling beside them.
    let mut lease = leases.get(LEASE).await.expect("Lease");
    let spec = lease.spec.as_mut().expect("spec");
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace(LEASE, &PostParams::default(), &lease)
        .await
        .expect("take the Lease");
    let stopped = tokio::time::timeout(Duration::from_secs(30), newcomer.task)
        .await
        .expect("the ousted leader to stop")
        .expect("task");
    match stopped {
        Err(RunError::LostLease(lost)) => {
            assert!(lost.to_string().contains("intruder"), "{lost}")
        }
        other => panic!("expected a lost Lease, got {other:?}"),
    }
}
