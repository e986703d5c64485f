//! The `Boundary` custom resource (`cairn.dev/v1alpha1`): what a user declares, and the
//! status the operator reports back. The CRD YAML in `deploy/crds/` is generated from these
//! types (`cairn-operator crd`), so the doc comments here are the user-facing reference.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Voters when `replicas` is left out: the smallest cluster that survives a node failure.
pub const DEFAULT_REPLICAS: i32 = 3;
/// Each node's volume when `storage.size` is left out.
pub const DEFAULT_STORAGE_SIZE: &str = "10Gi";

/// A Cairn event store serving one boundary: a Raft cluster of `replicas` nodes, each a pod
/// of a StatefulSet with its own volume. The boundary exists from the cluster's first start.
// Clippy reads the printer columns' repeated `type_ = "string"` as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "cairn.dev",
    version = "v1alpha1",
    kind = "Boundary",
    namespaced,
    shortname = "bnd",
    status = "BoundaryStatus",
    derive = "PartialEq",
    doc = "A Cairn event store cluster serving one boundary.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Leader", type_ = "string", json_path = ".status.leader"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BoundarySpec {
    /// Raft voters: 1, 3 or 5 (an even count tolerates no more failures than the odd count
    /// below it). Changing it grows or shrinks the Raft membership one node at a time.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 5))]
    pub replicas: i32,

    /// The boundary's name inside Cairn (`^[A-Za-z_][A-Za-z0-9_]*$`, what clients put in
    /// their requests). Defaults to the resource's name with each `-` as `_`. Cannot change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_name: Option<String>,

    /// Container image running `cairn`. Defaults to the operator's `--cairn-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Each node's persistent volume.
    #[serde(default)]
    pub storage: StorageSpec,

    /// CPU and memory requests and limits of each node's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub resources: Option<ResourceRequirements>,

    /// Retries by event id are idempotent (a write whose event ids all belong to one earlier
    /// identical write returns that write's result; any other reuse of a stored id is
    /// refused). Set at creation; cannot change (a change is refused as ImmutableField).
    #[serde(default)]
    pub idempotent_event_ids: bool,

    /// Secret (same namespace) with `username` and `password` keys for Cairn's admin user.
    /// When absent, the operator generates `<name>-admin` once and never overwrites it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_secret_ref: Option<SecretRef>,

    /// TLS on the client port and mutual TLS between the nodes. Set at creation; cannot
    /// change (a change is refused as ImmutableField).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Prometheus integration.
    #[serde(default)]
    pub monitoring: MonitoringSpec,

    /// Where the pods may run.
    #[serde(default)]
    pub placement: PlacementSpec,

    /// What deleting the Boundary does to the nodes' volumes: `Retain` (the default) keeps
    /// the PersistentVolumeClaims, so the data survives; `Delete` removes them.
    #[serde(default)]
    pub volume_reclaim_policy: VolumeReclaimPolicy,
}

fn default_replicas() -> i32 {
    DEFAULT_REPLICAS
}

/// Each node's persistent volume.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Volume size, a Kubernetes quantity (`10Gi`). It may grow: each node's claim is
    /// resized (the storage class must allow expansion); it never shrinks (refused).
    #[serde(default = "default_storage_size")]
    pub size: String,

    /// Storage class of the volumes; the cluster's default class when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

fn default_storage_size() -> String {
    DEFAULT_STORAGE_SIZE.to_string()
}

/// A Secret in the Boundary's namespace.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct SecretRef {
    /// The Secret's name.
    pub name: String,
}

/// TLS on the client port and mutual TLS between the nodes.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Who issues the certificates. `operator`: the operator keeps a CA for the Boundary
    /// (Secret `<name>-ca-key`, its certificate alone in `<name>-ca` for clients) and
    /// issues each pod a certificate naming its peer DNS name and the client Service's
    /// names, renewed well before expiry. `certManager` (with `issuerRef`): the operator
    /// asks cert-manager for the same certificates (a `Certificate` per pod, and one for
    /// itself) and hands each pod the Secret cert-manager fills; the issuer must put its CA
    /// in the Secrets' `ca.crt` (a CA or Vault issuer does).
    pub mode: TlsMode,
    /// The cert-manager Issuer or ClusterIssuer, for `certManager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// Who issues a Boundary's certificates.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TlsMode {
    /// The operator, from a CA of the Boundary's own.
    Operator,
    /// cert-manager, from `issuerRef`.
    CertManager,
}

/// A cert-manager issuer.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// Its name.
    pub name: String,
    /// `Issuer` (the default) or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The issuer's API group: `cert-manager.io` (the default) or an external issuer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Prometheus integration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Create a ServiceMonitor for the nodes' `/metrics` (only where the Prometheus
    /// operator's `monitoring.coreos.com` API is served).
    #[serde(default)]
    pub service_monitor: bool,
}

/// Where the pods may run. The operator adds a preferred anti-affinity that spreads the nodes
/// over hosts unless `affinity` is given.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// Node labels a host must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_array")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Pod affinity rules; replaces the operator's default spreading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub affinity: Option<Affinity>,
}

/// What deleting the Boundary does to its volumes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum VolumeReclaimPolicy {
    /// Keep the PersistentVolumeClaims (and the data).
    #[default]
    Retain,
    /// Delete the PersistentVolumeClaims with the Boundary.
    Delete,
}

/// What the operator last observed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BoundaryStatus {
    /// Pending, Provisioning, Active, Degraded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The pod that leads the Raft group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,

    /// The Raft membership as the leader reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Member>,

    /// Where clients connect (`host:port` of the client Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Available, Progressing and Degraded, each with a reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserve_unknown_array")]
    pub conditions: Vec<Condition>,
}

/// The lifecycle phase of a Boundary.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Phase {
    /// Accepted, no pod running yet (or the spec is invalid and nothing was applied).
    Pending,
    /// Pods are starting or the Raft group is forming or changing membership.
    Provisioning,
    /// Every replica is ready and a leader serves.
    Active,
    /// A quorum serves, but some replicas are not ready.
    Degraded,
    /// No quorum: the boundary cannot accept writes.
    Failed,
}

/// One Raft member.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Raft node id (the pod's ordinal + 1).
    pub id: u64,
    /// The pod.
    pub pod: String,
    /// `voter` or `learner`.
    pub role: String,
}

/// Kubernetes' own types carry their schema in the API server; the CRD keeps them opaque so
/// it does not pin one Kubernetes version's fields (the server validates them in the pod).
fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn preserve_unknown_array(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn a_minimal_manifest_gets_the_documented_defaults() {
        let boundary: Boundary = serde_saphyr::from_str(
            "apiVersion: cairn.dev/v1alpha1\nkind: Boundary\nmetadata: {name: orders}\nspec: {}\n",
        )
        .expect("parse");
        assert_eq!(boundary.spec.replicas, DEFAULT_REPLICAS);
        assert_eq!(boundary.spec.storage.size, DEFAULT_STORAGE_SIZE);
        assert_eq!(
            boundary.spec.volume_reclaim_policy,
            VolumeReclaimPolicy::Retain
        );
        assert!(!boundary.spec.idempotent_event_ids);
        assert!(!boundary.spec.monitoring.service_monitor);
    }

    #[test]
    fn the_crd_names_scope_and_columns_are_the_documented_ones() {
        let crd = Boundary::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("boundaries.cairn.dev"));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["bnd".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Phase", "Ready", "Leader", "Age"]);
    }
}
