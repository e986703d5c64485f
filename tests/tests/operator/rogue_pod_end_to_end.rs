//! Pods that pass for members of a Boundary never hear from the operator, so they never
//! receive the cluster secret (which lets its holder act as a leader). Anyone who may
//! create pods in the namespace can give one the Boundary's labels, a member-like name and
//! even an owner reference naming the StatefulSet; the operator must still talk only to the
//! pods the StatefulSet made.
//!
//! The rogue pods are not run by the test kubelet: the test binds listeners at their IPs on
//! every port the operator could dial, reports them Running and Ready as a kubelet would,
//! and counts what connects. The real pods around them are real `cairn` processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cairn_operator::build;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex;

use super::end_to_end::{
    BOUNDARY, CLUSTER_WAIT, KubeletCluster, POD_NETWORK, active_with, in_private_network,
    secret_value,
};
use super::kubelet::{NODE_NAME, NOT_RUN_LABEL, patch_status};
use super::{NAMESPACE, eventually_within, poke};

#[test]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest) and root (unshare -n, unshare -m); run by .ci/run with --ignored"]
fn rogue_pods_with_the_boundarys_labels_never_receive_the_cluster_secret() {
    in_private_network(
        "rogue_pod_end_to_end::rogue_pods_with_the_boundarys_labels_never_receive_the_cluster_secret",
        rogue_pods_never_hear_from_the_operator(),
    );
}

/// Listeners standing in for a rogue pod on every port of a Cairn pod, recording every
/// connection and the bytes it brought.
struct Rogue {
    pod: String,
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<u8>>>,
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl Rogue {
    async fn listen(pod: &str, ip: std::net::Ipv4Addr) -> Rogue {
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let mut listeners = Vec::new();
        for port in [build::CLIENT_PORT, build::PEER_PORT, build::HTTP_PORT] {
            let port = u16::try_from(port).expect("port");
            let listener = tokio::net::TcpListener::bind((ip, port))
                .await
                .unwrap_or_else(|e| panic!("bind the rogue's {ip}:{port}: {e}"));
            let (connections, received) = (connections.clone(), received.clone());
            listeners.push(tokio::spawn(async move {
                while let Ok((mut stream, from)) = listener.accept().await {
                    eprintln!("rogue {ip}:{port}: a connection from {from}");
                    connections.fetch_add(1, Ordering::SeqCst);
                    let received = received.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n) = stream.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            received.lock().await.extend_from_slice(&buf[..n]);
                        }
                    });
                }
            }));
        }
        Rogue {
            pod: pod.to_string(),
            connections,
            received,
            listeners,
        }
    }

    async fn assert_untouched(&self, secret: &str) {
        let received = self.received.lock().await;
        assert!(
            !received
                .windows(secret.len())
                .any(|window| window == secret.as_bytes()),
            "rogue pod {} received the cluster secret",
            self.pod
        );
        assert_eq!(
            self.connections.load(Ordering::SeqCst),
            0,
            "something dialled rogue pod {} ({} bytes: {:?})",
            self.pod,
            received.len(),
            String::from_utf8_lossy(&received[..received.len().min(400)])
        );
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
    }
}

/// Creates pod `name` with the labels of the StatefulSet's pods (and `owner`'s
/// references), then reports it Running and Ready at `ip`, as a kubelet would.
async fn create_rogue(
    pods: &Api<Pod>,
    name: &str,
    set: &StatefulSet,
    owner: Option<serde_json::Value>,
    ip: std::net::Ipv4Addr,
) {
    let mut labels = set
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("the pod template's labels");
    labels.insert(NOT_RUN_LABEL.into(), "true".into());
    // The revision of the set's own pods, so the StatefulSet controller, when it takes a
    // rogue for one of its replicas, does not delete it as out of date and then wait for a
    // termination no kubelet here would finish.
    if let Some(revision) = set.status.as_ref().and_then(|s| s.update_revision.clone()) {
        labels.insert("controller-revision-hash".into(), revision);
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "nodeName": NODE_NAME,
            "hostname": name,
            "subdomain": build::peer_service_name(BOUNDARY),
            "containers": [{"name": "cairn", "image": "rogue:latest"}],
        },
    }))
    .expect("rogue pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create rogue pod {name}: {e}"));
    patch_status(pods, name, ip, true)
        .await
        .unwrap_or_else(|e| panic!("report rogue pod {name} Ready: {e}"));
}

async fn rogue_pods_never_hear_from_the_operator() {
    let cluster = KubeletCluster::start().await;
    let (client, kubelet) = (&cluster.client, &cluster.kubelet);
    let boundaries = cluster
        .create_boundary(serde_json::json!({"replicas": 3, "storage": {"size": "1Gi"}}))
        .await;
    active_with(&boundaries, &[1, 2, 3]).await;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster_secret = secret_value(&secrets, "orders-cluster", build::CLUSTER_SECRET_KEY).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let set = sets.get(BOUNDARY).await.expect("the StatefulSet");
    let forged_owner = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": BOUNDARY,
        "uid": set.metadata.uid.clone().expect("the set's uid"),
        "controller": true,
    });
    // Addresses the test kubelet does not hand out this early (it counts up from .1).
    let address =
        |host| std::net::Ipv4Addr::new(POD_NETWORK[0], POD_NETWORK[1], POD_NETWORK[2], host);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut rogues = Vec::new();
    // The labels, a name that parses as ordinal 1 if leading zeros are allowed, and an
    // owner reference with the StatefulSet's UID, which the API server accepts from anyone.
    for (name, owner, host) in [
        ("orders-01", Some(forged_owner.clone()), 200),
        // The labels and a member-like name but no owner: the StatefulSet controller adopts
        // it (then deletes it, its ordinal being past the replicas).
        ("orders-7", None, 201),
        // The labels and the forged owner on a name that is no ordinal at all.
        ("orders-backup", Some(forged_owner.clone()), 202),
    ] {
        rogues.push(Rogue::listen(name, address(host)).await);
        create_rogue(&pods, name, &set, owner, address(host)).await;
    }

    // Work that makes the operator dial pods: every reconcile asks the members who leads;
    // a member's pod going and coming back makes it re-check membership and the joins.
    for _ in 0..3 {
        poke(client, BOUNDARY).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let replaced = build::pod_name(BOUNDARY, 3);
    let old_uid = pods.get(&replaced).await.expect("pod").metadata.uid;
    pods.delete(&replaced, &DeleteParams::default())
        .await
        .expect("delete a member's pod");
    eventually_within("the member's pod to come back", CLUSTER_WAIT, || {
        let (kubelet, pods, replaced) = (kubelet, pods.clone(), replaced.clone());
        let old_uid = old_uid.clone();
        async move {
            let pod = pods.get_opt(&replaced).await.ok()??;
            (pod.metadata.uid != old_uid && kubelet.ip(&replaced).await.is_some()).then_some(())
        }
    })
    .await;
    let status = active_with(&boundaries, &[1, 2, 3]).await;
    for _ in 0..3 {
        poke(client, BOUNDARY).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let members: Vec<&str> = status.members.iter().map(|m| m.pod.as_str()).collect();
    assert_eq!(members, ["orders-0", "orders-1", "orders-2"]);
    for rogue in &rogues {
        rogue.assert_untouched(&cluster_secret).await;
    }
    eprintln!(
        "{} rogue pods with the Boundary's labels, Running and Ready, were never dialled",
        rogues.len()
    );
}
