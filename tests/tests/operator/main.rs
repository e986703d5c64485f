//! The operator against a real Kubernetes control plane: kube-apiserver 1.20, etcd and
//! kube-controller-manager (StatefulSet controller and garbage collector) from
//! `../shared/tools/k8s-envtest`. Here, without a kubelet, the StatefulSet's Pods are
//! created and never run; `end_to_end` adds a test kubelet ([`kubelet`]) that runs them as
//! real `cairn` processes; `chart` installs the Helm chart and checks its RBAC.
//!
//! Gated (`#[ignore]`): `make test-real-servers` and `.ci/run` run them, with the tools found
//! through `CAIRN_SHARED_TOOLS` (or `../shared/tools` beside the clone).

mod cert_manager_end_to_end;
mod chart;
mod end_to_end;
mod kubelet;
mod leader_election;
mod rogue_pod_end_to_end;
mod tls_end_to_end;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cairn_operator::controller::{self, Context};
use cairn_operator::metrics::Metrics;
use cairn_operator::validate::OperatorDefaults;
use cairn_operator::{Boundary, build::FIELD_MANAGER};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, CustomResourceExt, Resource, ResourceExt};

const NAMESPACE: &str = "shop";
const WAIT: Duration = Duration::from_secs(60);

/// A control plane started for one test and stopped when dropped.
pub struct Envtest {
    tool: PathBuf,
    dir: tempfile::TempDir,
}

/// Builds kube-apiserver and kube-controller-manager once (a no-op when cached). The tests
/// start control planes from parallel threads and from a child process in a network
/// namespace of its own; on a fresh machine the first start builds for minutes (apt,
/// compiling), and concurrent builds fight over apt's lock. So every start goes through
/// here: one build at a time across processes (a file lock), and before any test leaves the
/// network it needs to download the sources.
pub fn ensure_envtest_built() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let lock_path = std::env::temp_dir().join("cairn-k8s-envtest-build.lock");
        let lock = std::fs::File::create(&lock_path).expect("create the envtest build lock");
        lock.lock().expect("take the envtest build lock");
        let status = Command::new(shared_tools().join("k8s-envtest"))
            .arg("build")
            .status()
            .expect("run k8s-envtest build");
        assert!(status.success(), "k8s-envtest build failed");
    });
}

impl Envtest {
    pub fn start() -> Envtest {
        ensure_envtest_built();
        let tool = shared_tools().join("k8s-envtest");
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new(&tool)
            .arg("start")
            .arg(dir.path())
            .status()
            .expect("run k8s-envtest");
        assert!(status.success(), "k8s-envtest start failed");
        Envtest { tool, dir }
    }

    /// The admin kubeconfig k8s-envtest wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("client config");
        Client::try_from(config).expect("client")
    }
}

impl Envtest {
    /// Runs more of kube-controller-manager's controllers than k8s-envtest starts, as a second
    /// instance of the same binary (stopped when dropped): `endpoint` fills a Service's
    /// Endpoints from its ready pods, `pvc-protection` holds a claim while a pod uses it.
    pub fn start_controllers(&self, controllers: &str) -> ChildGuard {
        let cache = std::env::var_os("CAIRN_K8S_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_K8S_CACHE));
        let log = std::fs::File::create(self.dir.path().join("extra-controllers.log"))
            .expect("controller log");
        let child = Command::new(cache.join("kube-controller-manager"))
            .arg(format!(
                "--kubeconfig={}",
                self.dir.path().join("kubeconfig").display()
            ))
            .arg(format!("--controllers={controllers}"))
            .args(["--leader-elect=false", "--port=0", "--secure-port=0"])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start kube-controller-manager (built by k8s-envtest)");
        ChildGuard(child)
    }
}

/// Where k8s-envtest caches its binaries unless `CAIRN_K8S_CACHE` says otherwise.
const DEFAULT_K8S_CACHE: &str = "/var/cache/cairn-k8s/1.20.2";

/// A process killed when dropped.
pub struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Envtest {
    fn drop(&mut self) {
        let _ = Command::new(&self.tool)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

pub fn shared_tools() -> PathBuf {
    match std::env::var_os("CAIRN_SHARED_TOOLS") {
        Some(dir) => PathBuf::from(dir),
        None => cairn_tests::repo_root().join("../shared/tools"),
    }
}

/// Polls `probe` until it yields a value, or panics naming `what` after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, probe).await
}

/// Polls `probe` until it yields a value, or panics naming `what` after `wait`.
pub async fn eventually_within<T, F, Fut>(what: &str, wait: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "boundaries.cairn.dev",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(Boundary::crd()),
    )
    .await
    .expect("install the CRD");
    established(&crds, "boundaries.cairn.dev").await;
}

/// Waits until the API server serves CRD `name` (its `Established` condition is True).
pub async fn established(crds: &Api<CustomResourceDefinition>, name: &str) {
    eventually(
        &format!("the CRD {name} to be Established"),
        || async move {
            crds.get(name)
                .await
                .ok()?
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

pub fn boundaries_raw(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cairn.dev", "v1alpha1", "Boundary");
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(&gvk, "boundaries"),
    )
}

pub fn manifest(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "Boundary",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": spec,
    }))
    .expect("manifest")
}

pub async fn create_namespace(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))
                .expect("namespace"),
        )
        .await
        .expect("create the namespace");
}

pub async fn discover(client: &Client) -> Context {
    Context::discover(
        client.clone(),
        OperatorDefaults {
            image: "cairn:test".into(),
            network_policy: None,
        },
        Arc::new(Metrics::new().expect("register metrics")),
    )
    .await
    .expect("discover")
}

/// Deletes Boundary `name` and waits until it is gone (its finalizer has run).
pub async fn delete_and_wait(boundaries: &Api<Boundary>, name: &str) {
    boundaries
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the Boundary");
    eventually("the finalizer to run and the Boundary to go", || {
        let boundaries = boundaries.clone();
        async move { boundaries.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

fn owned_by(meta: &kube::api::ObjectMeta, boundary: &Boundary) -> bool {
    meta.owner_references.iter().flatten().any(|r| {
        r.kind == "Boundary"
            && Some(&r.uid) == boundary.meta().uid.as_ref()
            && r.controller == Some(true)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest); run by .ci/run with --ignored"]
async fn a_boundary_becomes_its_objects_on_a_real_api_server() {
    let envtest = Envtest::start();
    let client = envtest.client().await;
    install_crd(&client).await;
    create_namespace(&client).await;

    // The server itself refuses what the schema rules out.
    let raw = boundaries_raw(&client);
    for (spec, why) in [
        (
            serde_json::json!({"replicas": "three"}),
            "a string for an integer",
        ),
        (
            serde_json::json!({"replicas": 7}),
            "above the schema's maximum",
        ),
        (
            serde_json::json!({"volumeReclaimPolicy": "Shred"}),
            "not one of the enum",
        ),
    ] {
        let err = raw
            .create(&PostParams::default(), &manifest("bad", spec))
            .await
            .expect_err(why);
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 422),
            "{why}: {err}"
        );
    }

    let context = discover(&client).await;
    assert!(
        !context.pdb_v1,
        "Kubernetes 1.20 serves only policy/v1beta1"
    );
    assert!(!context.capabilities.grpc_probes);
    let operator = tokio::spawn(controller::run(
        Arc::new(context),
        Some(NAMESPACE.into()),
        std::future::pending(),
    ));

    let boundaries: Api<Boundary> = Api::namespaced(client.clone(), NAMESPACE);
    raw.create(
        &PostParams::default(),
        &manifest(
            "orders",
            serde_json::json!({"replicas": 3, "storage": {"size": "1Gi"}}),
        ),
    )
    .await
    .expect("create the Boundary");
    let boundary = eventually("the operator's status", || {
        let boundaries = boundaries.clone();
        async move {
            let b = boundaries.get("orders").await.ok()?;
            b.status.as_ref()?.phase?;
            Some(b)
        }
    })
    .await;
    assert!(
        boundary
            .finalizers()
            .contains(&controller::FINALIZER.to_string()),
        "{:?}",
        boundary.finalizers()
    );
    let status = boundary.status.as_ref().expect("status");
    assert_eq!(status.endpoint.as_deref(), Some("orders.shop.svc:5005"));
    assert_eq!(status.ready_replicas, 0, "no kubelet runs the pods");
    let types: Vec<_> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Available", "Progressing", "Degraded"]);

    // Every object, owned by the Boundary.
    let config = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get("orders-config")
        .await
        .expect("ConfigMap");
    assert!(owned_by(&config.metadata, &boundary));
    assert_eq!(
        config.data.as_ref().expect("data")["CAIRN_INITIAL_MEMBERS"],
        "1=orders-0.orders-peers.shop.svc:5006,2=orders-1.orders-peers.shop.svc:5006,3=orders-2.orders-peers.shop.svc:5006"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let admin = secrets.get("orders-admin").await.expect("admin Secret");
    assert!(owned_by(&admin.metadata, &boundary));
    let password = admin.data.as_ref().expect("data")["password"].0.clone();
    assert!(owned_by(
        &secrets
            .get("orders-cluster")
            .await
            .expect("cluster Secret")
            .metadata,
        &boundary
    ));
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    for name in ["orders", "orders-peers"] {
        assert!(
            owned_by(&services.get(name).await.expect(name).metadata, &boundary),
            "{name}"
        );
    }
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let set = sets.get("orders").await.expect("StatefulSet");
    assert!(owned_by(&set.metadata, &boundary));
    assert_eq!(set.spec.as_ref().and_then(|s| s.replicas), Some(3));
    let pdb_gvk = GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget");
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(&pdb_gvk, "poddisruptionbudgets"),
    );
    let pdb = pdbs.get("orders").await.expect("PodDisruptionBudget");
    assert!(owned_by(&pdb.metadata, &boundary));
    assert_eq!(pdb.data["spec"]["maxUnavailable"], 1);
    // The StatefulSet controller made the pods from the template the operator built.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("three pods", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=orders"))
                .await
                .ok()?;
            (list.items.len() == 3).then_some(())
        }
    })
    .await;

    // An invalid change is reported and changes nothing.
    raw.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
    )
    .await
    .expect("the schema allows 4");
    let refused = eventually("the refusal in the status", || {
        let boundaries = boundaries.clone();
        async move {
            let b = boundaries.get("orders").await.ok()?;
            let degraded = b
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "Degraded")?
                .clone();
            (degraded.reason == "UnsupportedReplicas").then_some(degraded)
        }
    })
    .await;
    assert_eq!(refused.status, "True");
    assert!(refused.message.contains("not 4"), "{}", refused.message);
    let set = sets.get("orders").await.expect("StatefulSet");
    assert_eq!(
        set.spec.as_ref().and_then(|s| s.replicas),
        Some(3),
        "nothing was applied"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("a Warning Event on the Boundary", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("UnsupportedReplicas")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orders")
                })
                .then_some(())
        }
    })
    .await;

    // Fixing it resumes; the generated password survives every reconcile.
    raw.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await
    .expect("scale to 5");
    eventually("the StatefulSet to want 5", || {
        let sets = sets.clone();
        async move {
            let set = sets.get("orders").await.ok()?;
            (set.spec?.replicas == Some(5)).then_some(())
        }
    })
    .await;
    let config = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get("orders-config")
        .await
        .expect("ConfigMap");
    assert_eq!(
        config.data.as_ref().expect("data")["CAIRN_INITIAL_MEMBERS"]
            .split(',')
            .count(),
        3,
        "the formation members stay"
    );
    let admin = secrets.get("orders-admin").await.expect("admin Secret");
    assert_eq!(admin.data.as_ref().expect("data")["password"].0, password);

    // Deleting the Boundary: the finalizer runs, then the garbage collector removes what it
    // owned.
    delete_and_wait(&boundaries, "orders").await;
    eventually("the garbage collector to remove the owned objects", || {
        let (sets, services, secrets) = (sets.clone(), services.clone(), secrets.clone());
        async move {
            let gone = sets.get_opt("orders").await.ok()?.is_none()
                && services.get_opt("orders").await.ok()?.is_none()
                && services.get_opt("orders-peers").await.ok()?.is_none()
                && secrets.get_opt("orders-admin").await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await;
    operator.abort();
}

/// The body of `GET path` on an operator's HTTP side port (HTTP/1.0: the server closes).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the operator's HTTP port");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: operator\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

/// The value of the sample named exactly `series` (with its labels) in a text exposition.
pub fn metric(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{exposition}"))
        .trim()
        .parse()
        .expect("a number")
}

/// The storage a claim requests.
fn requested_storage(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.as_str())
}

/// Acts as the persistent-volume controller for the claims of Boundary `name`: each becomes
/// Bound with `capacity` (nothing provisions volumes on this control plane).
async fn bind_claims(client: &Client, name: &str, count: usize, capacity: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={name}");
    let listed = eventually(&format!("{count} claims of {name}"), || {
        let (claims, selector) = (claims.clone(), selector.clone());
        async move {
            let list = claims
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            (list.items.len() == count).then_some(list.items)
        }
    })
    .await;
    for claim in listed {
        let claim_name = claim.metadata.name.expect("claim name");
        claims
            .patch_status(
                &claim_name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": capacity}}
                })),
            )
            .await
            .expect("bind the claim");
    }
}

/// The condition `type_` of Boundary `name` once its reason is `reason`.
pub(crate) async fn condition_with(
    boundaries: &Api<Boundary>,
    name: &str,
    type_: &str,
    reason: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    eventually(&format!("{type_} {reason} on {name}"), || {
        let boundaries = boundaries.clone();
        async move {
            let b = boundaries.get(name).await.ok()?;
            let condition = b
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == type_)?;
            (condition.reason == reason).then_some(condition)
        }
    })
    .await
}

/// Wakes the operator for `name` now (it looks again every 30 s anyway): claims are not
/// watched, a change to the Boundary is.
pub(crate) async fn poke(client: &Client, name: &str) {
    boundaries_raw(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"test.cairn.dev/poke": uuid::Uuid::new_v4().to_string()}}
            })),
        )
        .await
        .expect("annotate the Boundary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest); run by .ci/run with --ignored"]
async fn volumes_grow_claim_by_claim_and_never_shrink_on_a_real_api_server() {
    let envtest = Envtest::start();
    let client = envtest.client().await;
    install_crd(&client).await;
    create_namespace(&client).await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    for (class, expandable) in [("expandable", true), ("fixed", false)] {
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": {"name": class},
                    "provisioner": "test.cairn.dev/none",
                    "allowVolumeExpansion": expandable,
                }))
                .expect("storage class"),
            )
            .await
            .expect("create the storage class");
    }
    let operator = tokio::spawn(controller::run(
        Arc::new(discover(&client).await),
        Some(NAMESPACE.into()),
        std::future::pending(),
    ));
    let raw = boundaries_raw(&client);
    let boundaries: Api<Boundary> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, class) in [("orders", "expandable"), ("billing", "fixed")] {
        raw.create(
            &PostParams::default(),
            &manifest(
                name,
                serde_json::json!({"replicas": 3, "storage": {"size": "1Gi", "storageClassName": class}}),
            ),
        )
        .await
        .expect("create a Boundary");
        bind_claims(&client, name, 3, "1Gi").await;
    }

    // Growing: every claim is asked for the new size; the StatefulSet's template (immutable)
    // keeps the old one and remembers the new one in an annotation.
    raw.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"storage": {"size": "2Gi"}}})),
    )
    .await
    .expect("grow orders");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("every claim of orders to ask for 2Gi", || {
        let claims = claims.clone();
        async move {
            let list = claims
                .list(&ListParams::default().labels("app.kubernetes.io/instance=orders"))
                .await
                .ok()?;
            list.items
                .iter()
                .all(|c| requested_storage(c) == Some("2Gi"))
                .then_some(())
        }
    })
    .await;
    let set = Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
        .get("orders")
        .await
        .expect("StatefulSet");
    let template = &set
        .spec
        .as_ref()
        .expect("spec")
        .volume_claim_templates
        .as_ref()
        .expect("claims")[0];
    assert_eq!(
        template
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .expect("requests")["storage"]
            .0,
        "1Gi"
    );
    assert_eq!(
        set.metadata.annotations.as_ref().expect("annotations")["cairn.dev/volume-size"],
        "2Gi"
    );
    let growing = condition_with(&boundaries, "orders", "Progressing", "VolumesGrowing").await;
    assert_eq!(growing.message, "3 volume(s) growing to 2Gi");

    // The volumes reached the size (here the test plays the storage driver): settled again.
    bind_claims(&client, "orders", 3, "2Gi").await;
    poke(&client, "orders").await;
    let settled = eventually("orders to stop growing", || {
        let boundaries = boundaries.clone();
        async move {
            let b = boundaries.get("orders").await.ok()?;
            let progressing = b
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Progressing")?;
            (progressing.reason != "VolumesGrowing").then_some(progressing)
        }
    })
    .await;
    assert_ne!(settled.reason, "VolumesGrowing");

    // Shrinking is measured against the grown size and refused.
    raw.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"storage": {"size": "1536Mi"}}})),
    )
    .await
    .expect("the schema allows any quantity");
    let shrink = condition_with(&boundaries, "orders", "Degraded", "StorageShrink").await;
    assert!(
        shrink.message.contains("volumes' 2Gi"),
        "{}",
        shrink.message
    );

    // A storage class that cannot expand: the API server refuses, the status says so.
    raw.patch(
        "billing",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"storage": {"size": "2Gi"}}})),
    )
    .await
    .expect("grow billing");
    let refused = condition_with(&boundaries, "billing", "Degraded", "VolumeResizeRefused").await;
    assert!(
        refused.message.contains("cannot grow to 2Gi"),
        "{}",
        refused.message
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("a VolumeResizeRefused Event", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("VolumeResizeRefused")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("billing")
                })
                .then_some(())
        }
    })
    .await;
    let billing_claims = claims
        .list(&ListParams::default().labels("app.kubernetes.io/instance=billing"))
        .await
        .expect("claims");
    for claim in &billing_claims.items {
        assert_eq!(requested_storage(claim), Some("1Gi"), "nothing changed");
    }
    operator.abort();
}
