//! The operator's side of Cairn's cluster API (`cairn.v1.Cluster` on each pod's peer port):
//! asking the pods for their view, and sending a membership change to the leader. Pods are
//! reached at their pod IP, which needs no cluster DNS from wherever the operator runs.

use std::time::Duration;

use cairn_proto::CLUSTER_SECRET_HEADER;
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use futures::future::join_all;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::build::PEER_PORT;
use crate::membership::{Change, ClusterView, ViewMember};

/// How long connecting to a pod may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of one call (a membership change waits for its commit).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to a pod failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod could not be reached.
    #[error("failed to connect to {pod} ({address}): {source}")]
    Connect {
        /// The pod.
        pod: String,
        /// Where it was dialled.
        address: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The pod answered with an error.
    #[error("{pod} refused {call}: {code:?}: {message}")]
    Refused {
        /// The pod.
        pod: String,
        /// The call.
        call: String,
        /// The gRPC code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The cluster secret is not valid metadata.
    #[error("the cluster secret is not valid gRPC metadata")]
    Secret,
}

/// The pods that may be sent the cluster secret: those the StatefulSet `set` controls
/// (an owner reference with its UID, marked controller) with an ordinal below its replicas,
/// not being deleted, with an IP. Labels and a name that looks right prove nothing: anyone
/// who may create pods in the namespace can give a pod both, and would then collect the
/// secret, which lets its holder act as a leader.
pub fn trusted_endpoints(name: &str, set: &StatefulSet, pods: &[Pod]) -> Vec<PodEndpoint> {
    let Some(uid) = set.metadata.uid.as_deref() else {
        return Vec::new();
    };
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            pod.metadata.owner_references.iter().flatten().any(|owner| {
                owner.uid == uid && owner.kind == "StatefulSet" && owner.controller == Some(true)
            })
        })
        .filter_map(|pod| {
            let pod_name = pod.metadata.name.clone()?;
            let ordinal = crate::build::pod_ordinal(name, &pod_name)?;
            if ordinal >= replicas {
                return None;
            }
            let ip = pod.status.as_ref()?.pod_ip.clone()?;
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let host = format!(
                "{pod_name}.{}.{namespace}.svc",
                crate::build::peer_service_name(name)
            );
            Some(PodEndpoint {
                ordinal,
                pod: pod_name,
                ip,
                host,
            })
        })
        .collect()
}

/// A pod of the Boundary with an IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEndpoint {
    /// Its ordinal in the StatefulSet.
    pub ordinal: i32,
    /// The pod's name.
    pub pod: String,
    /// Its IP (`status.podIP`).
    pub ip: String,
    /// Its stable peer DNS name, which its certificate names when the Boundary has TLS.
    pub host: String,
}

impl PodEndpoint {
    fn address(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        if self.ip.contains(':') {
            format!("{scheme}://[{}]:{PEER_PORT}", self.ip)
        } else {
            format!("{scheme}://{}:{PEER_PORT}", self.ip)
        }
    }
}

/// How the operator speaks to the pods of a Boundary with TLS: it trusts the Boundary's CA
/// only, checks that a pod dialled at its IP presents a certificate naming the pod's peer
/// DNS name, and presents a certificate of that CA (the peer port takes no other).
#[derive(Clone)]
pub struct PeerTls {
    /// The Boundary's CA (PEM).
    pub ca_pem: String,
    /// The operator's certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

/// What the pods said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The leader's view, when a pod that leads answered.
    pub view: Option<ClusterView>,
    /// The leading pod.
    pub leader: Option<PodEndpoint>,
    /// How many pods answered.
    pub answered: usize,
}

/// The cluster API of one pod, authenticated with the cluster secret.
pub struct Node {
    pod: PodEndpoint,
    client: ClusterClient<tonic::transport::Channel>,
    secret: MetadataValue<tonic::metadata::Ascii>,
}

impl Node {
    /// Connects to `pod`, with TLS when `tls`.
    pub async fn connect(
        pod: &PodEndpoint,
        secret: &str,
        tls: Option<&PeerTls>,
    ) -> Result<Node, Error> {
        let address = pod.address(tls.is_some());
        let connect_error = |source| Error::Connect {
            pod: pod.pod.clone(),
            address: address.clone(),
            source,
        };
        let mut endpoint = Endpoint::from_shared(address.clone()).map_err(connect_error)?;
        if let Some(tls) = tls {
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
                .domain_name(pod.host.clone());
            endpoint = endpoint.tls_config(config).map_err(connect_error)?;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect()
            .await
            .map_err(connect_error)?;
        Ok(Node {
            pod: pod.clone(),
            client: ClusterClient::new(channel),
            secret: secret.parse().map_err(|_| Error::Secret)?,
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert(CLUSTER_SECRET_HEADER, self.secret.clone());
        request
    }

    fn refused(&self, call: &str, status: tonic::Status) -> Error {
        Error::Refused {
            pod: self.pod.pod.clone(),
            call: call.into(),
            code: status.code(),
            message: status.message().into(),
        }
    }

    /// The pod's view of the cluster.
    pub async fn status(&mut self) -> Result<pb::StatusResponse, Error> {
        let request = self.request(pb::StatusRequest {});
        self.client
            .status(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| self.refused("Status", s))
    }

    /// Carries out `change`; the pod should be the leader (a follower passes it on).
    pub async fn change(&mut self, change: Change) -> Result<(), Error> {
        let result = match change {
            Change::Promote(node_id) => {
                let request = self.request(pb::PromoteRequest { node_id });
                self.client.promote(request).await.map(|_| ())
            }
            Change::Remove(node_id) => {
                let request = self.request(pb::RemoveNodeRequest { node_id });
                self.client.remove_node(request).await.map(|_| ())
            }
            Change::TransferLeader(node_id) => {
                let request = self.request(pb::TransferLeaderRequest { node_id });
                self.client.transfer_leader(request).await.map(|_| ())
            }
        };
        result.map_err(|s| self.refused(&format!("{change:?}"), s))
    }
}

/// Asks every pod for its view; the leader's (highest term, should two claim it) is the one
/// membership decisions use. Pods that do not answer are logged and skipped.
pub async fn observe(pods: &[PodEndpoint], secret: &str, tls: Option<&PeerTls>) -> Observed {
    let answers = join_all(pods.iter().map(|pod| async move {
        let mut node = Node::connect(pod, secret, tls).await?;
        node.status().await.map(|status| (pod.clone(), status))
    }))
    .await;
    let mut answered = 0;
    let mut leader: Option<(PodEndpoint, pb::StatusResponse)> = None;
    for answer in answers {
        match answer {
            Ok((pod, status)) => {
                answered += 1;
                let leads = status.role == "leader"
                    && leader.as_ref().is_none_or(|(_, l)| l.term < status.term);
                if leads {
                    leader = Some((pod, status));
                }
            }
            Err(e) => tracing::debug!("no cluster status: {e}"),
        }
    }
    let (leader, view) = match leader {
        Some((pod, status)) => (Some(pod), Some(view(&status))),
        None => (None, None),
    };
    Observed {
        view,
        leader,
        answered,
    }
}

/// The leader's Status as the membership plan reads it.
pub fn view(status: &pb::StatusResponse) -> ClusterView {
    ClusterView {
        leader_id: status.node_id,
        members: status
            .members
            .iter()
            .map(|m| ViewMember {
                node_id: m.node_id,
                voter: m.voter,
            })
            .collect(),
        last_log_index: status.last_log_index,
        matched: status
            .followers
            .iter()
            .map(|f| (f.node_id, f.matched_index))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn set(replicas: i32) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("orders".into()),
                uid: Some("set-uid".into()),
                ..ObjectMeta::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                ..StatefulSetSpec::default()
            }),
            ..StatefulSet::default()
        }
    }

    fn owned_by(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "orders".into(),
            uid: uid.into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }
    }

    fn pod(name: &str, owners: Vec<OwnerReference>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(format!("10.0.0.{}", name.len())),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn names(endpoints: &[PodEndpoint]) -> Vec<&str> {
        endpoints.iter().map(|e| e.pod.as_str()).collect()
    }

    #[test]
    fn only_the_stateful_sets_own_pods_below_its_replicas_are_trusted() {
        let mine = || vec![owned_by("set-uid", true)];
        let mut deleting = pod("orders-1", mine());
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let pods = [
            pod("orders-0", mine()),
            deleting,
            pod("orders-2", mine()),
            // What a user who may create pods, but not read Secrets, could start: the
            // labels (not checked here, the list selected by them) and a fitting name.
            pod("orders-3", vec![]),
            pod("orders-4", vec![owned_by("another-set", true)]),
            pod("orders-5", vec![owned_by("set-uid", false)]),
            pod("orders-9", mine()),
            pod("payments-0", mine()),
            // The StatefulSet controller adopts an orphan whose name parses as one of its
            // ordinals ("orders-01": ordinal 1), so an owner reference alone proves nothing
            // for a name it would not have given.
            pod("orders-01", mine()),
        ];
        assert_eq!(
            names(&trusted_endpoints("orders", &set(3), &pods)),
            ["orders-0", "orders-2"]
        );
        // While surplus nodes leave, the StatefulSet keeps them and so does the trust.
        assert_eq!(
            names(&trusted_endpoints("orders", &set(10), &pods)),
            ["orders-0", "orders-2", "orders-9"]
        );
    }

    #[test]
    fn a_stateful_set_without_a_uid_trusts_no_pod() {
        let mut unsaved = set(3);
        unsaved.metadata.uid = None;
        let pods = [pod("orders-0", vec![owned_by("set-uid", true)])];
        assert!(trusted_endpoints("orders", &unsaved, &pods).is_empty());
    }
}
