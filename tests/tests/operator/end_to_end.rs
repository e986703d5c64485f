//! A Boundary becomes a Raft cluster of real `cairn` processes, run by the test kubelet:
//! Active with the real leader and members; writes and reads through the client Service's
//! endpoints; 3 → 5 → 3 under writes with no acknowledged write lost; the leader's Pod
//! deleted, a new leader, the recreated Pod back on its volume; a follower's claim and Pod
//! deleted (a lost volume), the Pod back on an empty one, rejoined with every event.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_operator::cluster_api::{Node, PeerTls, PodEndpoint};
use cairn_operator::controller;
use cairn_operator::crd::{BoundaryStatus, Phase};
use cairn_operator::{Boundary, build};
use cairn_proto::cairn_v1 as cluster_pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use cairn_tests::{Credentials, orisun as pb};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::kubelet::Kubelet;
use super::{
    ChildGuard, Envtest, NAMESPACE, boundaries_raw, create_namespace, discover, eventually_within,
    install_crd, manifest,
};

pub(crate) const BOUNDARY: &str = "orders";
/// Set in the re-run of the test inside its own network namespace.
const PRIVATE_NETWORK: &str = "CAIRN_TEST_PRIVATE_NETWORK";
/// The pods' addresses: 198.18.0.0/24 (RFC 2544's benchmarking range) on the loopback
/// interface of a private network namespace. The API server refuses loopback addresses
/// (127/8) in a Service's Endpoints, and a namespace touches nothing outside the test.
pub(crate) const POD_NETWORK: [u8; 3] = [198, 18, 0];
/// Starting processes, electing, joining and catching up: generous for a loaded 2-core CI.
pub(crate) const CLUSTER_WAIT: Duration = Duration::from_secs(180);

#[test]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest) and root (unshare -n, unshare -m); run by .ci/run with --ignored"]
fn a_boundary_runs_as_a_raft_cluster_of_real_cairn_processes() {
    in_private_network(
        "end_to_end::a_boundary_runs_as_a_raft_cluster_of_real_cairn_processes",
        boundary_runs_as_a_cluster(),
    );
}

/// Runs `test` (this binary's test `name`) inside a network namespace of its own, where
/// the API server, the operator, the pods and the clients share a local pod network: the
/// test binary re-runs itself there with [`PRIVATE_NETWORK`] set.
pub fn in_private_network(name: &str, test: impl std::future::Future<Output = ()>) {
    if std::env::var_os(PRIVATE_NETWORK).is_none() {
        // Built out here: the namespace below has no route to the package mirrors.
        super::ensure_envtest_built();
        let status = std::process::Command::new("unshare")
            .arg("-n")
            .arg("sh")
            .arg("-c")
            .arg(r#"ip link set lo up && ip addr add "$0" dev lo && exec "$@""#)
            .arg(format!(
                "{}.{}.{}.254/24",
                POD_NETWORK[0], POD_NETWORK[1], POD_NETWORK[2]
            ))
            .arg(std::env::current_exe().expect("test binary"))
            .args([name, "--exact", "--ignored", "--nocapture"])
            .env(PRIVATE_NETWORK, "1")
            .status()
            .expect("run unshare -n (needs root and iproute2)");
        assert!(
            status.success(),
            "failed in its network namespace (output above)"
        );
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test);
}

async fn boundary_runs_as_a_cluster() {
    let cluster = KubeletCluster::start().await;
    let (client, kubelet) = (&cluster.client, &cluster.kubelet);
    let boundaries = cluster
        .create_boundary(serde_json::json!({"replicas": 3, "storage": {"size": "1Gi"}}))
        .await;

    // Three real processes, one Raft group; the status names its real leader.
    let status = active_with(&boundaries, &[1, 2, 3]).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster_secret = secret_value(&secrets, "orders-cluster", build::CLUSTER_SECRET_KEY).await;
    let leader = agreed_leader(kubelet, &cluster_secret, &[1, 2, 3]).await;
    assert_eq!(status.leader, Some(build::pod_name(BOUNDARY, leader)));
    assert_eq!(status.ready_replicas, 3);

    // A client through the client Service's endpoints, with the generated admin user.
    let credentials = Credentials::basic(
        "admin",
        &secret_value(&secrets, "orders-admin", "password").await,
    );
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), NAMESPACE);
    let addresses = eventually_within("three client endpoints", CLUSTER_WAIT, || {
        let endpoints = endpoints.clone();
        async move {
            let addresses = client_addresses(&endpoints).await;
            (addresses.len() == 3).then_some(addresses)
        }
    })
    .await;
    let mut first = event_store(addresses[0], &credentials);
    let written = first
        .save_events_v2(pb::SaveEventsV2Request {
            boundary: BOUNDARY.into(),
            events: vec![cairn_tests::event("Hello", r#"{"from":"the test"}"#)],
            consistency: vec![],
        })
        .await
        .expect("write through an endpoint");
    assert!(written.into_inner().log_position.is_some());
    let mut other = event_store(addresses[2], &credentials);
    let read = all_events(&mut other).await;
    assert_eq!(read.len(), 1, "another node reads what one took");

    // 3 → 5 → 3 while a client keeps writing.
    let writer = Writer::start(endpoints.clone(), credentials.clone());
    writer.wait_for(20).await;
    scale(&boundaries, 5).await;
    active_with(&boundaries, &[1, 2, 3, 4, 5]).await;
    agreed_leader(kubelet, &cluster_secret, &[1, 2, 3, 4, 5]).await;
    let grown = writer.acknowledged();
    writer.wait_for(grown + 20).await;

    scale(&boundaries, 3).await;
    active_with(&boundaries, &[1, 2, 3]).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    eventually_within(
        "the removed nodes' pods and volumes to go",
        CLUSTER_WAIT,
        || {
            let (kubelet, claims) = (kubelet, claims.clone());
            async move {
                let pods_gone = kubelet.running().await.len() == 3;
                let mut claims_gone = true;
                for claim in ["data-orders-3", "data-orders-4"] {
                    claims_gone &= claims.get_opt(claim).await.ok()?.is_none();
                }
                (pods_gone && claims_gone).then_some(())
            }
        },
    )
    .await;
    let leader = agreed_leader(kubelet, &cluster_secret, &[1, 2, 3]).await;
    let shrunk = writer.acknowledged();
    writer.wait_for(shrunk + 20).await;
    let acknowledged = writer.stop().await;

    // Every acknowledged write is there exactly once, on every node.
    let leader_ip = kubelet
        .ip(&build::pod_name(BOUNDARY, leader))
        .await
        .expect("leader runs");
    let mut on_leader = event_store(client_addr(leader_ip), &credentials);
    let events = all_events(&mut on_leader).await;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for event in &events {
        *counts.entry(event.event_id.as_str()).or_default() += 1;
    }
    for id in &acknowledged {
        assert_eq!(counts.get(id.as_str()), Some(&1), "acknowledged write {id}");
    }
    for id in 1..=3 {
        assert_eq!(
            events_on(kubelet, &credentials, id).await,
            events.len(),
            "node {id}"
        );
    }
    eprintln!(
        "scaling: {} writes acknowledged (of {} events stored) while growing to 5 and shrinking to 3",
        acknowledged.len(),
        events.len()
    );

    // The leader's pod goes: another leads, the status follows, the pod comes back on its
    // volume (same claim, its data) and takes part again.
    let leader_pod = build::pod_name(BOUNDARY, leader);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let old_uid = pods.get(&leader_pod).await.expect("pod").metadata.uid;
    let claim_name = format!("data-{leader_pod}");
    let claim_uid = claims.get(&claim_name).await.expect("claim").metadata.uid;
    pods.delete(&leader_pod, &DeleteParams::default())
        .await
        .expect("delete the leader's pod");
    let new_leader = eventually_within("a new leader in the status", CLUSTER_WAIT, || {
        let boundaries = boundaries.clone();
        let leader_pod = leader_pod.clone();
        async move {
            let status = boundaries.get(BOUNDARY).await.ok()?.status?;
            status.leader.filter(|l| *l != leader_pod)
        }
    })
    .await;
    eprintln!("{leader_pod} deleted; {new_leader} leads");
    active_with(&boundaries, &[1, 2, 3]).await;
    let recreated = pods.get(&leader_pod).await.expect("recreated pod");
    assert_ne!(recreated.metadata.uid, old_uid, "a new incarnation");
    assert_eq!(
        claims.get(&claim_name).await.expect("claim").metadata.uid,
        claim_uid,
        "on the same volume"
    );
    agreed_leader(kubelet, &cluster_secret, &[1, 2, 3]).await;
    assert_eq!(
        events_on(kubelet, &credentials, leader).await,
        events.len(),
        "the recreated node has every event"
    );

    // A follower's volume is lost: its claim goes, then its pod; the StatefulSet makes
    // both again and the pod starts, with the flags it always had, on an empty volume. It
    // must not vote on the log it lost: it rejoins, catches up and votes again, and every
    // node still holds every event.
    let leader = agreed_leader(kubelet, &cluster_secret, &[1, 2, 3]).await;
    let wiped = (1..=3).find(|&id| id != leader).expect("a follower");
    let wiped_pod = build::pod_name(BOUNDARY, wiped);
    let wiped_claim = format!("data-{wiped_pod}");
    let lost_claim_uid = claims.get(&wiped_claim).await.expect("claim").metadata.uid;
    claims
        .delete(&wiped_claim, &DeleteParams::default())
        .await
        .expect("delete the follower's claim");
    pods.delete(&wiped_pod, &DeleteParams::default())
        .await
        .expect("delete the follower's pod");
    eventually_within(
        "the follower's pod to come back on a new, empty claim",
        CLUSTER_WAIT,
        || {
            let (kubelet, claims) = (kubelet, claims.clone());
            let (wiped_pod, wiped_claim) = (wiped_pod.clone(), wiped_claim.clone());
            let lost_claim_uid = lost_claim_uid.clone();
            async move {
                let claim = claims.get_opt(&wiped_claim).await.ok()??;
                let fresh = claim.metadata.uid != lost_claim_uid;
                (fresh && kubelet.ip(&wiped_pod).await.is_some()).then_some(())
            }
        },
    )
    .await;
    eventually_within("the wiped node to vote again", CLUSTER_WAIT, || {
        let (kubelet, secret) = (kubelet, cluster_secret.as_str());
        async move {
            let status = node_status(kubelet, secret, None, wiped).await?;
            (status.standing == "voting").then_some(())
        }
    })
    .await;
    agreed_leader(kubelet, &cluster_secret, &[1, 2, 3]).await;
    active_with(&boundaries, &[1, 2, 3]).await;
    for id in 1..=3 {
        assert_eq!(
            events_on(kubelet, &credentials, id).await,
            events.len(),
            "node {id} after node {wiped} lost its volume"
        );
    }
    eprintln!("{wiped_pod} lost its volume, rejoined and votes again with every event");
}

/// Waits for the status to be Active with exactly `voters` as voting members and a leader.
pub(crate) async fn active_with(boundaries: &Api<Boundary>, voters: &[u64]) -> BoundaryStatus {
    eventually_within(
        &format!("Active with voters {voters:?}"),
        CLUSTER_WAIT,
        || {
            let boundaries = boundaries.clone();
            async move {
                let status = boundaries.get(BOUNDARY).await.ok()?.status?;
                let ids: Vec<u64> = status
                    .members
                    .iter()
                    .filter(|m| m.role == "voter")
                    .map(|m| m.id)
                    .collect();
                let done = status.phase == Some(Phase::Active)
                    && status.leader.is_some()
                    && ids == voters
                    && status.members.len() == voters.len();
                done.then_some(status)
            }
        },
    )
    .await
}

/// Every pod of `voters` answers Cluster/Status with the same leader and exactly these
/// voters; returns the leader's id.
async fn agreed_leader(kubelet: &Kubelet, secret: &str, voters: &[u64]) -> u64 {
    agreed_leader_over(kubelet, secret, None, voters).await
}

/// [`agreed_leader`], asking the pods with `tls` when the Boundary has TLS.
pub async fn agreed_leader_over(
    kubelet: &Kubelet,
    secret: &str,
    tls: Option<&PeerTls>,
    voters: &[u64],
) -> u64 {
    eventually_within(
        &format!("every node to agree on voters {voters:?}"),
        CLUSTER_WAIT,
        || async move {
            let mut leaders = Vec::new();
            for id in voters {
                let status = node_status(kubelet, secret, tls, *id).await?;
                let mut members: Vec<u64> = status
                    .members
                    .iter()
                    .filter(|m| m.voter)
                    .map(|m| m.node_id)
                    .collect();
                members.sort_unstable();
                if members != voters || status.members.len() != voters.len() {
                    return None;
                }
                leaders.push(status.leader_id);
            }
            let leader = leaders[0];
            (leader != 0 && leaders.iter().all(|l| *l == leader)).then_some(leader)
        },
    )
    .await
}

async fn node_status(
    kubelet: &Kubelet,
    secret: &str,
    tls: Option<&PeerTls>,
    node_id: u64,
) -> Option<cluster_pb::StatusResponse> {
    let pod = build::pod_name(BOUNDARY, node_id);
    let ip = kubelet.ip(&pod).await?;
    let endpoint = PodEndpoint {
        ordinal: i32::try_from(node_id).ok()? - 1,
        host: format!(
            "{pod}.{}.{NAMESPACE}.svc",
            build::peer_service_name(BOUNDARY)
        ),
        pod,
        ip: ip.to_string(),
    };
    Node::connect(&endpoint, secret, tls)
        .await
        .ok()?
        .status()
        .await
        .ok()
}

pub(crate) async fn secret_value(secrets: &Api<Secret>, name: &str, key: &str) -> String {
    let secret = secrets.get(name).await.expect("secret");
    let bytes = secret.data.and_then(|mut d| d.remove(key)).expect("key");
    String::from_utf8(bytes.0).expect("utf-8")
}

async fn scale(boundaries: &Api<Boundary>, replicas: i32) {
    boundaries
        .patch(
            BOUNDARY,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale");
}

/// The ready addresses of the client Service, as the endpoints controller publishes them.
async fn client_addresses(endpoints: &Api<Endpoints>) -> Vec<SocketAddr> {
    let Ok(Some(found)) = endpoints.get_opt(BOUNDARY).await else {
        return Vec::new();
    };
    let mut addresses = Vec::new();
    for subset in found.subsets.iter().flatten() {
        let port = subset
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("grpc"))
            .map(|p| p.port);
        for address in subset.addresses.iter().flatten() {
            if let (Some(port), Ok(ip)) = (port, address.ip.parse::<Ipv4Addr>()) {
                addresses.push(SocketAddr::from((ip, u16::try_from(port).unwrap_or(0))));
            }
        }
    }
    addresses.sort();
    addresses
}

/// How many events the pod of node `id` serves.
async fn events_on(kubelet: &Kubelet, credentials: &Credentials, id: u64) -> usize {
    let ip = kubelet
        .ip(&build::pod_name(BOUNDARY, id))
        .await
        .expect("the pod runs");
    all_events(&mut event_store(client_addr(ip), credentials))
        .await
        .len()
}

pub(crate) fn client_addr(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::from((ip, u16::try_from(build::CLIENT_PORT).expect("port")))
}

pub(crate) type EventStore =
    EventStoreClient<tonic::service::interceptor::InterceptedService<Channel, Credentials>>;

fn event_store(addr: SocketAddr, credentials: &Credentials) -> EventStore {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    EventStoreClient::with_interceptor(channel, credentials.clone())
}

pub(crate) async fn all_events(client: &mut EventStore) -> Vec<pb::Event> {
    let events = client
        .get_events(pb::GetEventsRequest {
            query: None,
            from_position: None,
            count: 10_000,
            direction: pb::Direction::Asc as i32,
            boundary: BOUNDARY.into(),
        })
        .await
        .expect("read every event")
        .into_inner()
        .events;
    assert!(
        events.len() < 10_000,
        "one page (the largest allowed) holds them all"
    );
    events
}

/// A client writing one event at a time through whichever endpoint the Service lists,
/// keeping the ids of the writes the server acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<std::sync::Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Writer {
    fn start(endpoints: Api<Endpoints>, credentials: Credentials) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (stop, acknowledged) = (stop.clone(), acknowledged.clone());
            async move {
                let mut clients: BTreeMap<SocketAddr, EventStore> = BTreeMap::new();
                let mut n = 0usize;
                while !stop.load(Ordering::Acquire) {
                    let addresses = client_addresses(&endpoints).await;
                    let Some(addr) = addresses.get(n % addresses.len().max(1)).copied() else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    n += 1;
                    let client = clients
                        .entry(addr)
                        .or_insert_with(|| event_store(addr, &credentials));
                    let event = cairn_tests::event("Written", &format!(r#"{{"n":{n}}}"#));
                    let id = event.event_id.clone();
                    let result = client
                        .save_events_v2(pb::SaveEventsV2Request {
                            boundary: BOUNDARY.into(),
                            events: vec![event],
                            consistency: vec![],
                        })
                        .await;
                    match result {
                        Ok(_) => acknowledged.lock().expect("lock").push(id),
                        // A node leaving or restarting: the write may or may not have
                        // happened, and is not counted either way.
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Writer {
            stop,
            acknowledged,
            task,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().expect("lock").len()
    }

    async fn wait_for(&self, count: usize) {
        eventually_within(
            &format!("{count} acknowledged writes"),
            CLUSTER_WAIT,
            || async move { (self.acknowledged() >= count).then_some(()) },
        )
        .await;
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Release);
        self.task.await.expect("writer");
        std::mem::take(&mut *self.acknowledged.lock().expect("lock"))
    }
}

/// The `cairn` binary this build made (`target/<profile>/cairn`, beside this test's
/// `deps/`), or `CAIRN_BIN`.
pub(crate) fn cairn_binary() -> PathBuf {
    let binary = std::env::var_os("CAIRN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("test binary path");
            exe.parent()
                .and_then(Path::parent)
                .expect("target dir")
                .join("cairn")
        });
    assert!(
        binary.exists(),
        "{} is missing: build it with the tests (`make test-real-servers` does) or set CAIRN_BIN",
        binary.display()
    );
    binary
}

/// What every test with the kubelet runs on: a control plane with the endpoints and
/// claim-protection controllers, the test kubelet running the namespace's pods as `cairn`
/// processes, and the operator. On failure it prints the pods' logs; dropped, it stops the
/// operator, then the pods, then the control plane.
pub(crate) struct KubeletCluster {
    pub(crate) kubelet: Kubelet,
    pub(crate) client: Client,
    operator: JoinHandle<()>,
    _controllers: ChildGuard,
    _envtest: Envtest,
}

impl KubeletCluster {
    pub(crate) async fn start() -> KubeletCluster {
        Self::start_with(async |_| {}).await
    }

    /// [`KubeletCluster::start`], with `prepare` installing what the operator must find
    /// when it starts (cert-manager's CRD, say).
    pub(crate) async fn start_with(prepare: impl AsyncFnOnce(&Client)) -> KubeletCluster {
        let envtest = Envtest::start();
        let client = envtest.client().await;
        install_crd(&client).await;
        prepare(&client).await;
        create_namespace(&client).await;
        let controllers = envtest.start_controllers("endpoint,pvc-protection");
        let kubelet = Kubelet::start(client.clone(), NAMESPACE, cairn_binary(), POD_NETWORK).await;
        let operator = tokio::spawn(controller::run(
            Arc::new(discover(&client).await),
            Some(NAMESPACE.into()),
            std::future::pending(),
        ));
        KubeletCluster {
            kubelet,
            client,
            operator,
            _controllers: controllers,
            _envtest: envtest,
        }
    }

    /// Creates Boundary [`BOUNDARY`] with `spec`; the typed API to follow it with.
    pub(crate) async fn create_boundary(&self, spec: serde_json::Value) -> Api<Boundary> {
        boundaries_raw(&self.client)
            .create(&PostParams::default(), &manifest(BOUNDARY, spec))
            .await
            .expect("create the Boundary");
        Api::namespaced(self.client.clone(), NAMESPACE)
    }
}

impl Drop for KubeletCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.kubelet.logs(40));
        }
        self.operator.abort();
    }
}
