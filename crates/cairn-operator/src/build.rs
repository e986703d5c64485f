//! Step three of a reconcile: the Kubernetes objects a valid Boundary becomes. Pure: the
//! same input always gives the same objects, so the tests below pin them field by field and
//! server-side apply sees no change when nothing changed.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities as LinuxCapabilities, ConfigMap, ConfigMapEnvSource, Container,
    ContainerPort, EnvFromSource, EnvVar, EnvVarSource, GRPCAction, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm,
    PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::certificates::{CA_CERT_KEY, TLS_MOUNT, tls_secret_name};
use crate::crd::TlsMode;
use crate::validate::{OperatorPods, ValidBoundary};

/// Client gRPC port (Orisun's default).
pub const CLIENT_PORT: i32 = 5005;
/// Peer gRPC port (Raft and the cluster API).
pub const PEER_PORT: i32 = 5006;
/// HTTP port: `/metrics`, `/healthz`, `/readyz`.
pub const HTTP_PORT: i32 = 9464;
/// The StatefulSet's volume claim template: pod `p`'s claim is `data-p`.
pub const DATA_CLAIM: &str = "data";
/// Where each node's volume is mounted, and its data directory inside it.
pub const DATA_MOUNT: &str = "/var/lib/cairn";
/// The data directory on the volume.
pub const DATA_DIR: &str = "/var/lib/cairn/data";
/// Where the cluster secret is mounted.
pub const CLUSTER_SECRET_MOUNT: &str = "/etc/cairn/cluster";
/// The key of the generated cluster Secret.
pub const CLUSTER_SECRET_KEY: &str = "secret";
/// The user and group the image's `cairn` runs as.
pub const RUN_AS: i64 = 10001;
/// Seconds between SIGTERM and SIGKILL: more than `cairn serve`'s own shutdown grace, so a
/// node finishes its in-flight writes and hands over leadership before it is killed.
pub const TERMINATION_GRACE_SECS: i64 = 60;
/// The field manager of every object the operator applies.
pub const FIELD_MANAGER: &str = "cairn-operator";
/// The label that marks objects as Cairn's.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The label naming the Boundary an object belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Annotation on the StatefulSet: the size the claims were asked to have. Its claim template
/// keeps the size the volumes were created with (Kubernetes forbids changing it), so this is
/// where a grown size is remembered (and what a later shrink is checked against).
pub const VOLUME_SIZE_ANNOTATION: &str = "cairn.dev/volume-size";
/// Annotation on the StatefulSet of a TLS Boundary: who issues its certificates
/// (`operator` or `certManager`), which cannot change while it runs.
pub const TLS_ISSUER_ANNOTATION: &str = "cairn.dev/tls-issuer";
/// The label naming an object's part of the Boundary.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// What the API server offers, learned in the dereference step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Kubernetes ≥ 1.24: probes may be gRPC health checks.
    pub grpc_probes: bool,
    /// `monitoring.coreos.com/v1` (the Prometheus operator) is served.
    pub service_monitors: bool,
}

/// Secret values the operator generates (random, made by the caller so this stays pure).
/// They are applied only when their Secret does not exist yet, never overwritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    /// The admin password when the operator owns the admin Secret.
    pub admin_password: String,
    /// The secret peers authenticate each other with.
    pub cluster_secret: String,
}

/// Every object of one Boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    /// The nodes' `CAIRN_*` settings.
    pub config_map: ConfigMap,
    /// The admin user's credentials, when generated (create-only).
    pub admin_secret: Option<Secret>,
    /// The peers' shared secret (create-only).
    pub cluster_secret: Secret,
    /// Headless Service giving each pod a stable DNS name, ready or not.
    pub peer_service: Service,
    /// The Service clients connect to (ready pods only).
    pub client_service: Service,
    /// The nodes.
    pub stateful_set: StatefulSet,
    /// Keeps voluntary disruptions (drains, evictions) from breaking quorum.
    pub pod_disruption_budget: PodDisruptionBudget,
    /// A `monitoring.coreos.com/v1` ServiceMonitor, when asked for and served.
    pub service_monitor: Option<serde_json::Value>,
    /// Who may reach which port, when the operator was told where its own pods run.
    pub network_policy: Option<NetworkPolicy>,
}

/// The headless peer Service's name.
pub fn peer_service_name(name: &str) -> String {
    format!("{name}-peers")
}

/// The ConfigMap's name.
pub fn config_map_name(name: &str) -> String {
    format!("{name}-config")
}

/// The generated cluster Secret's name.
pub fn cluster_secret_name(name: &str) -> String {
    format!("{name}-cluster")
}

/// The stable DNS name of pod `ordinal` (through the headless Service).
pub fn pod_host(valid: &ValidBoundary, ordinal: i32) -> String {
    format!(
        "{}-{ordinal}.{}.{}.svc",
        valid.name,
        peer_service_name(&valid.name),
        valid.namespace
    )
}

/// Raft node id of pod `ordinal`: ids start at 1, ordinals at 0.
pub fn node_id(ordinal: i32) -> u64 {
    u64::try_from(ordinal).unwrap_or(0) + 1
}

/// The pod of Raft node `node_id` in the StatefulSet `name`.
pub fn pod_name(name: &str, node_id: u64) -> String {
    format!("{name}-{}", node_id.saturating_sub(1))
}

/// The ordinal of `pod` when it belongs to the StatefulSet `name`.
pub fn pod_ordinal(name: &str, pod: &str) -> Option<i32> {
    let ordinal = pod.strip_prefix(name)?.strip_prefix('-')?;
    // Digits only: "orders-extra-0" is not a pod of "orders". And the name the StatefulSet
    // gives ordinal N, exactly: "orders-01" parses as 1, matches the StatefulSet
    // controller's pattern (so it may even adopt such a pod) but is no pod it created.
    let parsed: i32 = ordinal
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| ordinal.parse().ok())
        .flatten()?;
    (parsed.to_string() == ordinal).then_some(parsed)
}

/// A TLS mode as the spec spells it.
pub fn tls_mode_name(mode: TlsMode) -> &'static str {
    match mode {
        TlsMode::Operator => "operator",
        TlsMode::CertManager => "certManager",
    }
}

/// The TLS mode an annotation value names (a StatefulSet from before the annotation has TLS
/// by the operator: the only mode then).
pub fn tls_mode_named(value: Option<&str>) -> Option<TlsMode> {
    match value {
        None | Some("operator") => Some(TlsMode::Operator),
        Some("certManager") => Some(TlsMode::CertManager),
        Some(_) => None,
    }
}

/// `--initial-members`: the voters the cluster is formed with. Pods beyond them join as
/// learners through these addresses and are promoted by the operator.
pub fn initial_members(valid: &ValidBoundary) -> String {
    (0..valid.initial_replicas)
        .map(|ordinal| {
            format!(
                "{}={}:{PEER_PORT}",
                node_id(ordinal),
                pod_host(valid, ordinal)
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Voters needed for a quorum.
pub fn quorum(replicas: i32) -> i32 {
    replicas / 2 + 1
}

/// The labels that select a Boundary's pods.
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), "cairn".to_string()),
        (INSTANCE_LABEL.to_string(), name.to_string()),
    ])
}

/// Selects the pods of Boundary `name`.
fn pods_of(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector_labels(name)),
        ..LabelSelector::default()
    }
}

fn labels(name: &str, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(name);
    labels.insert(COMPONENT_LABEL.into(), component.into());
    labels.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    labels
}

fn owner_reference(valid: &ValidBoundary) -> OwnerReference {
    OwnerReference {
        api_version: "cairn.dev/v1alpha1".into(),
        kind: "Boundary".into(),
        name: valid.name.clone(),
        uid: valid.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub(crate) fn metadata(valid: &ValidBoundary, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(valid.namespace.clone()),
        labels: Some(labels(&valid.name, component)),
        owner_references: Some(vec![owner_reference(valid)]),
        ..ObjectMeta::default()
    }
}

fn tcp_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// Builds every object of `valid`, with a StatefulSet of `pods` pods: the membership plan's
/// count, more than `valid.replicas` while surplus nodes are still leaving the Raft group.
pub fn build(
    valid: &ValidBoundary,
    capabilities: Capabilities,
    generated: &Generated,
    pods: i32,
) -> Objects {
    Objects {
        config_map: config_map(valid),
        admin_secret: valid
            .generate_admin_secret
            .then(|| admin_secret(valid, &generated.admin_password)),
        cluster_secret: secret(
            valid,
            cluster_secret_name(&valid.name),
            BTreeMap::from([(
                CLUSTER_SECRET_KEY.to_string(),
                generated.cluster_secret.clone(),
            )]),
        ),
        peer_service: peer_service(valid),
        client_service: client_service(valid),
        stateful_set: stateful_set(valid, capabilities, pods),
        pod_disruption_budget: pod_disruption_budget(valid),
        service_monitor: (valid.service_monitor && capabilities.service_monitors)
            .then(|| service_monitor(valid)),
        network_policy: valid
            .network_policy
            .as_ref()
            .map(|operator| network_policy(valid, operator)),
    }
}

/// The label every namespace carries with its own name (Kubernetes ≥ 1.21).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The peer port carries Raft, the cluster API and the cluster secret: only the Boundary's
/// own pods and the operator's may reach it. The client and HTTP ports stay open to any
/// source (applications, Prometheus, the kubelet's probes).
fn network_policy(valid: &ValidBoundary, operator: &OperatorPods) -> NetworkPolicy {
    let port = |number: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(number)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    };
    let boundary_pods = NetworkPolicyPeer {
        pod_selector: Some(pods_of(&valid.name)),
        ..NetworkPolicyPeer::default()
    };
    let operator_pods = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                operator.namespace.clone(),
            )])),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(operator.labels.clone()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    NetworkPolicy {
        metadata: metadata(valid, valid.name.clone(), "network-policy"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods_of(&valid.name)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    ports: Some(vec![port(PEER_PORT)]),
                    from: Some(vec![boundary_pods, operator_pods]),
                },
                NetworkPolicyIngressRule {
                    ports: Some(vec![port(CLIENT_PORT), port(HTTP_PORT)]),
                    from: None,
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// The ConfigMap key naming the cluster CA of peer TLS: present when the nodes speak TLS.
pub const PEER_TLS_CA_KEY: &str = "CAIRN_PEER_TLS_CA";

/// The ConfigMap key (an environment variable of every node) that declares the boundary
/// with idempotent event ids; present only for such boundaries.
pub const IDEMPOTENT_BOUNDARIES_KEY: &str = "CAIRN_IDEMPOTENT_BOUNDARIES";

fn config_map(valid: &ValidBoundary) -> ConfigMap {
    let mut data = BTreeMap::from(
        [
            ("CAIRN_BOUNDARIES", valid.boundary_name.clone()),
            ("CAIRN_DATA_DIR", DATA_DIR.to_string()),
            ("CAIRN_LISTEN", format!("0.0.0.0:{CLIENT_PORT}")),
            ("CAIRN_HTTP_LISTEN", format!("0.0.0.0:{HTTP_PORT}")),
            ("CAIRN_PEER_LISTEN", format!("0.0.0.0:{PEER_PORT}")),
            ("CAIRN_INITIAL_MEMBERS", initial_members(valid)),
            (
                "CAIRN_CLUSTER_SECRET_FILE",
                format!("{CLUSTER_SECRET_MOUNT}/{CLUSTER_SECRET_KEY}"),
            ),
            ("CAIRN_NODE_ID_FROM_HOSTNAME", "true".to_string()),
            ("CAIRN_LOG_FORMAT", "json".to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    if valid.tls.is_some() {
        data.insert(
            PEER_TLS_CA_KEY.to_string(),
            format!("{TLS_MOUNT}/{CA_CERT_KEY}"),
        );
    } else {
        // The peer port listens on every interface; without `spec.tls` its traffic is
        // plaintext, confined by the NetworkPolicy.
        data.insert(
            "CAIRN_ALLOW_PLAINTEXT_PEERS".to_string(),
            "true".to_string(),
        );
    }
    if valid.idempotent_event_ids {
        // The server creates the boundary with the option on first start; CAIRN_BOUNDARIES
        // still names it (it is what a later reconcile reads back as the boundary served).
        data.insert(
            IDEMPOTENT_BOUNDARIES_KEY.to_string(),
            valid.boundary_name.clone(),
        );
    }
    ConfigMap {
        metadata: metadata(valid, config_map_name(&valid.name), "config"),
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// A Secret of the Boundary (owned by it) holding `data`.
pub fn secret(valid: &ValidBoundary, name: String, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: metadata(valid, name, "credentials"),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

fn admin_secret(valid: &ValidBoundary, password: &str) -> Secret {
    secret(
        valid,
        valid.admin_secret.clone(),
        BTreeMap::from([
            ("username".to_string(), "admin".to_string()),
            ("password".to_string(), password.to_string()),
        ]),
    )
}

fn peer_service(valid: &ValidBoundary) -> Service {
    Service {
        metadata: metadata(valid, peer_service_name(&valid.name), "peers"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Peers must find each other before any is ready: readiness needs a quorum.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(&valid.name)),
            ports: Some(vec![
                tcp_port("peer", PEER_PORT),
                tcp_port("http", HTTP_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn client_service(valid: &ValidBoundary) -> Service {
    Service {
        metadata: metadata(valid, valid.name.clone(), "client"),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&valid.name)),
            ports: Some(vec![ServicePort {
                app_protocol: Some("grpc".into()),
                ..tcp_port("grpc", CLIENT_PORT)
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn env_from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..SecretKeySelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn http_probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    }
}

fn readiness_probe(capabilities: Capabilities, tls: bool) -> Probe {
    // The kubelet's gRPC probe speaks plaintext only; the HTTP port stays plaintext.
    let check = if capabilities.grpc_probes && !tls {
        Probe {
            grpc: Some(GRPCAction {
                port: CLIENT_PORT,
                service: None,
            }),
            ..Probe::default()
        }
    } else {
        http_probe("/readyz")
    };
    Probe {
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..check
    }
}

/// Liveness asks only whether the process answers: a node waiting for a quorum is alive, and
/// restarting it would not bring the quorum back.
fn liveness_probe() -> Probe {
    Probe {
        initial_delay_seconds: Some(10),
        period_seconds: Some(10),
        failure_threshold: Some(6),
        ..http_probe("/healthz")
    }
}

/// With TLS, each node serves its own certificate of `<name>-tls` on the client and peer
/// ports (chosen by its pod name), and `cairn cluster` run in the pod verifies the node by
/// its peer name although it dials 127.0.0.1.
fn tls_env(valid: &ValidBoundary) -> Vec<EnvVar> {
    if valid.tls.is_none() {
        return Vec::new();
    }
    let value = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..EnvVar::default()
    };
    let cert = format!("{TLS_MOUNT}/$(POD_NAME).crt");
    let key = format!("{TLS_MOUNT}/$(POD_NAME).key");
    vec![
        value("CAIRN_TLS_CERT", cert.clone()),
        value("CAIRN_TLS_KEY", key.clone()),
        value("CAIRN_PEER_TLS_CERT", cert),
        value("CAIRN_PEER_TLS_KEY", key),
        value(
            "CAIRN_TLS_SERVER_NAME",
            format!(
                "$(POD_NAME).{}.{}.svc",
                peer_service_name(&valid.name),
                valid.namespace
            ),
        ),
    ]
}

fn container(valid: &ValidBoundary, capabilities: Capabilities) -> Container {
    let port = |name: &str, port: i32| ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    Container {
        name: "cairn".into(),
        image: Some(valid.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["serve".into()]),
        env: Some(
            vec![
                env_from_field("POD_NAME", "metadata.name"),
                // Kubernetes expands $(POD_NAME) from the variable above.
                EnvVar {
                    name: "CAIRN_ADVERTISE_ADDR".into(),
                    value: Some(format!(
                        "$(POD_NAME).{}.{}.svc:{PEER_PORT}",
                        peer_service_name(&valid.name),
                        valid.namespace
                    )),
                    ..EnvVar::default()
                },
                env_from_secret("CAIRN_ADMIN_USERNAME", &valid.admin_secret, "username"),
                env_from_secret("CAIRN_ADMIN_PASSWORD", &valid.admin_secret, "password"),
            ]
            .into_iter()
            .chain(tls_env(valid))
            .collect(),
        ),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: config_map_name(&valid.name),
                ..ConfigMapEnvSource::default()
            }),
            ..EnvFromSource::default()
        }]),
        ports: Some(vec![
            port("grpc", CLIENT_PORT),
            port("peer", PEER_PORT),
            port("http", HTTP_PORT),
        ]),
        readiness_probe: Some(readiness_probe(capabilities, valid.tls.is_some())),
        liveness_probe: Some(liveness_probe()),
        resources: valid.resources.clone(),
        volume_mounts: Some(
            vec![
                VolumeMount {
                    name: DATA_CLAIM.into(),
                    mount_path: DATA_MOUNT.into(),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: "cluster-secret".into(),
                    mount_path: CLUSTER_SECRET_MOUNT.into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
            ]
            .into_iter()
            .chain(valid.tls.is_some().then(|| VolumeMount {
                name: "tls".into(),
                mount_path: TLS_MOUNT.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            }))
            .collect(),
        ),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(LinuxCapabilities {
                drop: Some(vec!["ALL".into()]),
                ..LinuxCapabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// Spread the nodes over hosts when the scheduler can; a user's affinity replaces this.
fn default_affinity(valid: &ValidBoundary) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(pods_of(&valid.name)),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

fn stateful_set(valid: &ValidBoundary, capabilities: Capabilities, pods: i32) -> StatefulSet {
    let mut requests = BTreeMap::new();
    requests.insert("storage".to_string(), Quantity(valid.storage_size.clone()));
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_CLAIM.into()),
            labels: Some(selector_labels(&valid.name)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: valid.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(requests),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    let pod = PodSpec {
        containers: vec![container(valid, capabilities)],
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECS),
        security_context: Some(PodSecurityContext {
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            run_as_non_root: Some(true),
            // The container runtime's default filter: what PSS "restricted" requires.
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        // A node never talks to the Kubernetes API: a mounted token could only leak.
        automount_service_account_token: Some(false),
        affinity: Some(
            valid
                .placement
                .affinity
                .clone()
                .unwrap_or_else(|| default_affinity(valid)),
        ),
        node_selector: valid.placement.node_selector.clone(),
        tolerations: valid.placement.tolerations.clone(),
        volumes: Some(
            [("cluster-secret", cluster_secret_name(&valid.name))]
                .into_iter()
                .chain(
                    valid
                        .tls
                        .is_some()
                        .then(|| ("tls", tls_secret_name(&valid.name))),
                )
                .map(|(volume, secret)| Volume {
                    name: volume.into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret),
                        default_mode: Some(0o400),
                        ..SecretVolumeSource::default()
                    }),
                    ..Volume::default()
                })
                .collect(),
        ),
        ..PodSpec::default()
    };
    let mut set_metadata = metadata(valid, valid.name.clone(), "node");
    let mut annotations = BTreeMap::from([(
        VOLUME_SIZE_ANNOTATION.to_string(),
        valid.volume_size.clone(),
    )]);
    if let Some(issuer) = &valid.tls {
        annotations.insert(
            TLS_ISSUER_ANNOTATION.to_string(),
            tls_mode_name(issuer.mode()).to_string(),
        );
    }
    set_metadata.annotations = Some(annotations);
    StatefulSet {
        metadata: set_metadata,
        spec: Some(StatefulSetSpec {
            replicas: Some(pods),
            service_name: Some(peer_service_name(&valid.name)),
            // All pods start at once: with OrderedReady, pod 0 would wait to be ready, which
            // needs a quorum, which needs pods 1 and 2.
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            selector: pods_of(&valid.name),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&valid.name, "node")),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            volume_claim_templates: Some(vec![claim]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// Voluntary disruptions may take down only what leaves a quorum standing. One node has no
/// quorum to keep: blocking every drain forever would be worse than the outage it cannot
/// avoid, so a single node may be evicted.
fn pod_disruption_budget(valid: &ValidBoundary) -> PodDisruptionBudget {
    let max_unavailable = (valid.replicas - quorum(valid.replicas)).max(1);
    PodDisruptionBudget {
        metadata: metadata(valid, valid.name.clone(), "node"),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            selector: Some(pods_of(&valid.name)),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

fn service_monitor(valid: &ValidBoundary) -> serde_json::Value {
    let meta = metadata(valid, valid.name.clone(), "monitoring");
    serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            // The peer Service lists every pod, ready or not: a node that cannot reach its
            // quorum is the one whose metrics matter most.
            "selector": { "matchLabels": labels(&valid.name, "peers") },
            "endpoints": [{ "port": "http", "path": "/metrics" }],
        },
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::{PlacementSpec, VolumeReclaimPolicy};
    use crate::validate::{CertManagerIssuer, Issuer};

    /// A valid plaintext Boundary "orders" of `replicas` pods, for tests to vary.
    pub(crate) fn valid(replicas: i32) -> ValidBoundary {
        ValidBoundary {
            name: "orders".into(),
            namespace: "shop".into(),
            uid: "uid-1".into(),
            boundary_name: "orders".into(),
            replicas,
            initial_replicas: replicas,
            image: "cairn:test".into(),
            storage_size: "10Gi".into(),
            volume_size: "10Gi".into(),
            storage_class_name: None,
            idempotent_event_ids: false,
            resources: None,
            admin_secret: "orders-admin".into(),
            generate_admin_secret: true,
            placement: PlacementSpec::default(),
            service_monitor: false,
            volume_reclaim_policy: VolumeReclaimPolicy::Retain,
            network_policy: None,
            tls: None,
        }
    }

    fn generated() -> Generated {
        Generated {
            admin_password: "pw".into(),
            cluster_secret: "0123456789abcdef0123".into(),
        }
    }

    fn objects(replicas: i32) -> Objects {
        build(
            &valid(replicas),
            Capabilities::default(),
            &generated(),
            replicas,
        )
    }

    fn pod_spec(objects: &Objects) -> &PodSpec {
        objects
            .stateful_set
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod spec")
    }

    fn every_metadata(objects: &Objects) -> Vec<&ObjectMeta> {
        let mut all = vec![
            &objects.config_map.metadata,
            &objects.cluster_secret.metadata,
            &objects.peer_service.metadata,
            &objects.client_service.metadata,
            &objects.stateful_set.metadata,
            &objects.pod_disruption_budget.metadata,
        ];
        all.extend(objects.admin_secret.as_ref().map(|s| &s.metadata));
        all
    }

    #[test]
    fn every_object_is_owned_by_the_boundary_and_labelled_with_it() {
        let objects = objects(3);
        for meta in every_metadata(&objects) {
            let name = meta.name.as_deref().unwrap_or_default();
            assert_eq!(meta.namespace.as_deref(), Some("shop"), "{name}");
            let owners = meta.owner_references.as_ref().expect("owner references");
            assert_eq!(owners.len(), 1, "{name}");
            assert_eq!(owners[0].kind, "Boundary");
            assert_eq!(owners[0].api_version, "cairn.dev/v1alpha1");
            assert_eq!(owners[0].uid, "uid-1");
            assert_eq!(owners[0].controller, Some(true));
            assert_eq!(owners[0].block_owner_deletion, Some(true));
            let labels = meta.labels.as_ref().expect("labels");
            assert_eq!(labels[NAME_LABEL], "cairn", "{name}");
            assert_eq!(labels[INSTANCE_LABEL], "orders", "{name}");
        }
    }

    #[test]
    fn pods_and_node_ids_map_both_ways() {
        assert_eq!(pod_name("orders", node_id(4)), "orders-4");
        assert_eq!(pod_ordinal("orders", "orders-4"), Some(4));
        assert_eq!(pod_ordinal("orders", "orders-12"), Some(12));
        assert_eq!(pod_ordinal("orders", "orders-extra-0"), None);
        assert_eq!(pod_ordinal("orders", "orders-"), None);
        assert_eq!(pod_ordinal("orders", "shop-0"), None);
        assert_eq!(pod_ordinal("orders", "orders-01"), None);
        assert_eq!(pod_ordinal("orders", "orders-0"), Some(0));
    }

    #[test]
    fn a_shrinking_set_keeps_its_pods_until_they_left_and_its_quorum_budget() {
        let objects = build(&valid(3), Capabilities::default(), &generated(), 5);
        let spec = objects.stateful_set.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(5));
        let pdb = objects.pod_disruption_budget.spec.as_ref().expect("pdb");
        assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            objects.config_map.data.as_ref().expect("data")["CAIRN_INITIAL_MEMBERS"],
            initial_members(&valid(3))
        );
    }

    #[test]
    fn an_idempotent_boundary_is_declared_to_every_node() {
        let mut idempotent = valid(3);
        idempotent.idempotent_event_ids = true;
        let built = build(&idempotent, Capabilities::default(), &generated(), 3);
        let data = built.config_map.data.expect("data");
        assert_eq!(data[IDEMPOTENT_BOUNDARIES_KEY], "orders");
        assert_eq!(data["CAIRN_BOUNDARIES"], "orders");
    }

    #[test]
    fn initial_members_name_each_pod_by_its_stable_dns_name_and_id() {
        assert_eq!(
            initial_members(&valid(3)),
            "1=orders-0.orders-peers.shop.svc:5006,\
             2=orders-1.orders-peers.shop.svc:5006,\
             3=orders-2.orders-peers.shop.svc:5006"
        );
        let mut scaled = valid(5);
        scaled.initial_replicas = 3;
        assert_eq!(
            initial_members(&scaled),
            initial_members(&valid(3)),
            "scaling keeps the formation members, so the pod template does not change"
        );
        let data = objects(3).config_map.data.expect("data");
        assert_eq!(data["CAIRN_INITIAL_MEMBERS"], initial_members(&valid(3)));
        assert_eq!(data["CAIRN_BOUNDARIES"], "orders");
        assert!(!data.contains_key(IDEMPOTENT_BOUNDARIES_KEY));
        assert_eq!(data["CAIRN_NODE_ID_FROM_HOSTNAME"], "true");
        assert_eq!(
            data["CAIRN_CLUSTER_SECRET_FILE"],
            "/etc/cairn/cluster/secret"
        );
    }

    #[test]
    fn services_expose_named_tcp_ports_and_peers_see_unready_pods() {
        let objects = objects(3);
        let peer = objects.peer_service.spec.as_ref().expect("spec");
        assert_eq!(peer.cluster_ip.as_deref(), Some("None"));
        assert_eq!(peer.publish_not_ready_addresses, Some(true));
        let ports: Vec<_> = peer
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.port, p.protocol.as_deref()))
            .collect();
        assert_eq!(
            ports,
            [
                (Some("peer"), 5006, Some("TCP")),
                (Some("http"), 9464, Some("TCP"))
            ]
        );
        let client = objects.client_service.spec.as_ref().expect("spec");
        assert_eq!(client.cluster_ip, None, "a normal ClusterIP service");
        assert_eq!(client.publish_not_ready_addresses, None);
        let port = &client.ports.as_ref().expect("ports")[0];
        assert_eq!(
            (
                port.name.as_deref(),
                port.port,
                port.protocol.as_deref(),
                port.app_protocol.as_deref()
            ),
            (Some("grpc"), 5005, Some("TCP"), Some("grpc"))
        );
        assert_eq!(client.selector, Some(selector_labels("orders")));
    }

    #[test]
    fn the_stateful_set_runs_cairn_with_probes_volumes_and_identity() {
        let objects = objects(3);
        let spec = objects.stateful_set.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.service_name.as_deref(), Some("orders-peers"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        let claims = spec.volume_claim_templates.as_ref().expect("claims");
        let claim = claims[0].spec.as_ref().expect("claim spec");
        assert_eq!(claim.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(
            claim
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .map(|r| r["storage"].0.as_str()),
            Some("10Gi")
        );
        assert_eq!(
            objects
                .stateful_set
                .metadata
                .annotations
                .as_ref()
                .map(|a| a[VOLUME_SIZE_ANNOTATION].as_str()),
            Some("10Gi"),
            "the size the claims should have, read back by the next reconcile"
        );

        let pod = pod_spec(&objects);
        assert_eq!(pod.termination_grace_period_seconds, Some(60));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("cairn:test"));
        assert_eq!(c.args, Some(vec!["serve".to_string()]));
        let ports: Vec<_> = c
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.container_port, p.protocol.as_deref()))
            .collect();
        assert_eq!(
            ports,
            [
                (Some("grpc"), 5005, Some("TCP")),
                (Some("peer"), 5006, Some("TCP")),
                (Some("http"), 9464, Some("TCP"))
            ]
        );
        let env: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e))
            .collect();
        assert_eq!(
            env["POD_NAME"]
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            Some("metadata.name")
        );
        assert_eq!(
            env["CAIRN_ADVERTISE_ADDR"].value.as_deref(),
            Some("$(POD_NAME).orders-peers.shop.svc:5006")
        );
        let names: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert!(
            names.iter().position(|n| *n == "POD_NAME")
                < names.iter().position(|n| *n == "CAIRN_ADVERTISE_ADDR"),
            "a variable can only expand the ones before it"
        );
        let password = env["CAIRN_ADMIN_PASSWORD"]
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("from the secret");
        assert_eq!(
            (password.name.as_str(), password.key.as_str()),
            ("orders-admin", "password")
        );
        assert_eq!(
            c.env_from
                .as_ref()
                .and_then(|e| e[0].config_map_ref.as_ref())
                .map(|r| r.name.as_str()),
            Some("orders-config")
        );

        let readiness = c.readiness_probe.as_ref().expect("readiness");
        let http = readiness
            .http_get
            .as_ref()
            .expect("an HTTP probe on Kubernetes < 1.24");
        assert_eq!(http.path.as_deref(), Some("/readyz"));
        assert_eq!(http.port, IntOrString::String("http".into()));
        let liveness = c.liveness_probe.as_ref().expect("liveness");
        assert_eq!(
            liveness.http_get.as_ref().and_then(|h| h.path.as_deref()),
            Some("/healthz")
        );

        let mounts: Vec<_> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("data", "/var/lib/cairn"),
                ("cluster-secret", "/etc/cairn/cluster")
            ]
        );
        let security = c.security_context.as_ref().expect("security context");
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            crate::pod_security::restricted_violations(pod),
            Vec::<String>::new(),
            "data pods must pass the restricted Pod Security Standard"
        );
        let anti = pod
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .expect("preferred anti-affinity");
        assert_eq!(
            anti[0].pod_affinity_term.topology_key,
            "kubernetes.io/hostname"
        );
    }

    #[test]
    fn a_tls_boundary_mounts_its_pods_certificates_and_probes_over_http() {
        let valid = ValidBoundary {
            tls: Some(Issuer::Operator),
            ..valid(3)
        };
        let grpc = Capabilities {
            grpc_probes: true,
            ..Capabilities::default()
        };
        let built = build(&valid, grpc, &generated(), 3);
        let data = built.config_map.data.as_ref().expect("data");
        assert_eq!(data[PEER_TLS_CA_KEY], "/etc/cairn/tls/ca.crt");
        assert!(!data.contains_key("CAIRN_ALLOW_PLAINTEXT_PEERS"));
        let pod = pod_spec(&built);
        let c = &pod.containers[0];
        let env: BTreeMap<&str, &str> = c
            .env
            .iter()
            .flatten()
            .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
            .collect();
        assert_eq!(env["CAIRN_TLS_CERT"], "/etc/cairn/tls/$(POD_NAME).crt");
        assert_eq!(env["CAIRN_PEER_TLS_KEY"], "/etc/cairn/tls/$(POD_NAME).key");
        assert_eq!(
            env["CAIRN_TLS_SERVER_NAME"],
            "$(POD_NAME).orders-peers.shop.svc"
        );
        let tls_volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "tls")
            .expect("the tls volume");
        assert_eq!(
            tls_volume
                .secret
                .as_ref()
                .and_then(|s| s.secret_name.as_deref()),
            Some("orders-tls")
        );
        assert!(c.volume_mounts.iter().flatten().any(|m| m.name == "tls"
            && m.mount_path == "/etc/cairn/tls"
            && m.read_only == Some(true)));
        let readiness = c.readiness_probe.as_ref().expect("readiness");
        assert!(
            readiness.grpc.is_none(),
            "the kubelet's gRPC probe cannot speak TLS"
        );
        assert!(readiness.http_get.is_some());
        assert_eq!(
            crate::pod_security::restricted_violations(pod),
            Vec::<String>::new()
        );
        let annotations = built.stateful_set.metadata.annotations.as_ref();
        assert_eq!(
            tls_mode_named(
                annotations
                    .and_then(|a| a.get(TLS_ISSUER_ANNOTATION))
                    .map(String::as_str)
            ),
            Some(TlsMode::Operator)
        );
        // With cert-manager the pods see the same files: the operator gathers what
        // cert-manager issued into the same Secret.
        let by_cert_manager = build(
            &ValidBoundary {
                tls: Some(Issuer::CertManager(CertManagerIssuer {
                    name: "ca".into(),
                    kind: "Issuer".into(),
                    group: "cert-manager.io".into(),
                })),
                ..valid.clone()
            },
            grpc,
            &generated(),
            3,
        );
        assert_eq!(pod_spec(&by_cert_manager), pod);
        assert_eq!(by_cert_manager.config_map, built.config_map);
        let annotations = by_cert_manager.stateful_set.metadata.annotations.as_ref();
        assert_eq!(
            tls_mode_named(
                annotations
                    .and_then(|a| a.get(TLS_ISSUER_ANNOTATION))
                    .map(String::as_str)
            ),
            Some(TlsMode::CertManager)
        );
        // Without TLS: the plaintext peer port is allowed, nothing is mounted.
        let plain = objects(3);
        let data = plain.config_map.data.as_ref().expect("data");
        assert_eq!(data["CAIRN_ALLOW_PLAINTEXT_PEERS"], "true");
        assert!(!data.contains_key(PEER_TLS_CA_KEY));
        assert!(
            pod_spec(&plain)
                .volumes
                .iter()
                .flatten()
                .all(|v| v.name != "tls")
        );
    }

    #[test]
    fn newer_servers_get_a_grpc_readiness_probe() {
        let objects = build(
            &valid(3),
            Capabilities {
                grpc_probes: true,
                ..Capabilities::default()
            },
            &generated(),
            3,
        );
        let c = &pod_spec(&objects).containers[0];
        let readiness = c.readiness_probe.as_ref().expect("readiness");
        assert_eq!(readiness.grpc.as_ref().map(|g| g.port), Some(5005));
        assert!(readiness.http_get.is_none());
        assert!(
            c.liveness_probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .is_some()
        );
    }

    #[test]
    fn the_disruption_budget_keeps_a_quorum() {
        let max_unavailable = |replicas| {
            objects(replicas)
                .pod_disruption_budget
                .spec
                .and_then(|s| s.max_unavailable)
        };
        assert_eq!(max_unavailable(3), Some(IntOrString::Int(1)));
        assert_eq!(max_unavailable(5), Some(IntOrString::Int(2)));
        assert_eq!(
            max_unavailable(1),
            Some(IntOrString::Int(1)),
            "a lone node may be drained"
        );
        assert_eq!((quorum(1), quorum(3), quorum(5)), (1, 2, 3));
    }

    #[test]
    fn secrets_are_generated_only_when_the_user_gave_none() {
        let objects = objects(3);
        let admin = objects.admin_secret.expect("generated");
        let data = admin.data.expect("data");
        assert_eq!(data["username"].0, b"admin");
        assert_eq!(data["password"].0, b"pw");
        let mut mine = valid(3);
        mine.generate_admin_secret = false;
        mine.admin_secret = "orders-creds".into();
        let objects = build(&mine, Capabilities::default(), &generated(), 3);
        assert!(objects.admin_secret.is_none());
        assert_eq!(
            objects.cluster_secret.data.expect("data")[CLUSTER_SECRET_KEY].0,
            b"0123456789abcdef0123"
        );
    }

    #[test]
    fn the_peer_port_admits_only_the_boundarys_pods_and_the_operator() {
        let mut v = valid(3);
        let built = |v: &ValidBoundary| build(v, Capabilities::default(), &generated(), 3);
        assert!(built(&v).network_policy.is_none(), "no policy unless asked");
        v.network_policy = Some(OperatorPods {
            namespace: "cairn-system".into(),
            labels: BTreeMap::from([("app.kubernetes.io/name".into(), "cairn-operator".into())]),
        });
        let policy = built(&v).network_policy.expect("a policy");
        assert_eq!(policy.metadata.name.as_deref(), Some("orders"));
        let spec = policy.spec.expect("spec");
        assert_eq!(
            spec.pod_selector.and_then(|s| s.match_labels),
            Some(selector_labels("orders"))
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let rules = spec.ingress.expect("rules");
        let ports = |i: usize| -> Vec<IntOrString> {
            rules[i]
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.port.clone())
                .collect()
        };
        assert_eq!(ports(0), [IntOrString::Int(PEER_PORT)]);
        let from = rules[0].from.as_ref().expect("peer sources");
        assert_eq!(from.len(), 2);
        assert_eq!(
            from[0]
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(selector_labels("orders"))
        );
        assert!(from[0].namespace_selector.is_none(), "same namespace only");
        let namespace = from[1]
            .namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("the operator's namespace");
        assert_eq!(namespace[NAMESPACE_NAME_LABEL], "cairn-system");
        assert_eq!(
            from[1]
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            v.network_policy.map(|o| o.labels)
        );
        assert_eq!(
            ports(1),
            [IntOrString::Int(CLIENT_PORT), IntOrString::Int(HTTP_PORT)]
        );
        assert!(rules[1].from.is_none(), "clients and probes from anywhere");
    }

    #[test]
    fn a_service_monitor_needs_both_the_wish_and_the_api() {
        let mut wanted = valid(3);
        wanted.service_monitor = true;
        let without_api = build(&wanted, Capabilities::default(), &generated(), 3);
        assert!(without_api.service_monitor.is_none());
        let with_api = build(
            &wanted,
            Capabilities {
                service_monitors: true,
                ..Capabilities::default()
            },
            &generated(),
            3,
        );
        let monitor = with_api.service_monitor.expect("monitor");
        assert_eq!(monitor["kind"], "ServiceMonitor");
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
        assert_eq!(
            monitor["spec"]["selector"]["matchLabels"][COMPONENT_LABEL],
            "peers"
        );
        assert!(objects(3).service_monitor.is_none(), "not asked for");
    }
}
