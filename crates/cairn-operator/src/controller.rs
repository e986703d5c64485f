//! The reconcile loop: dereference → validate → build → apply → status, for every Boundary
//! the operator can see. Only this module talks to the API server; the steps between are the
//! pure functions of [`crate::validate`], [`crate::build`] and [`crate::status`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizing, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::build::{self, Capabilities, FIELD_MANAGER, Generated, Objects};
use crate::cert_manager;
use crate::certificates;
use crate::cluster_api::{self, PodEndpoint};
use crate::crd::{Boundary, BoundaryStatus, Member, TlsMode, VolumeReclaimPolicy};
use crate::membership::{self, Change, ClusterView};
use crate::metrics::Metrics;
use crate::status::{self, ClusterSummary, Observation, Volumes};
use crate::validate::{
    self, CertManagerIssuer, Deployed, Invalid, Issuer, Observed, OperatorDefaults, SecretState,
    ValidBoundary,
};

/// Removes what owner references do not: the volumes, when the policy says so.
pub const FINALIZER: &str = "cairn.dev/cleanup";
/// How often a settled Boundary is looked at again without a watch event (status follows
/// pod readiness, which the StatefulSet's status reports).
pub const RESYNC: Duration = Duration::from_secs(30);
/// How soon a failed reconcile is retried.
pub const RETRY: Duration = Duration::from_secs(5);
/// How soon a Boundary whose Raft membership is changing is looked at again (each pass makes
/// at most one change, then waits for the cluster to report it).
pub const MEMBERSHIP_POLL: Duration = Duration::from_secs(2);
/// Length of generated passwords and cluster secrets (alphanumeric).
pub const GENERATED_SECRET_LEN: usize = 32;

/// Why a reconcile failed (it is retried after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A read from the API server failed.
    #[error("failed to read {what}: {source}")]
    Read {
        /// What was being read.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// Applying an object failed.
    #[error("failed to apply {what}: {source}")]
    Apply {
        /// The object.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("failed to write the status of {name}: {source}")]
    Status {
        /// The Boundary.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Deleting the volumes of a deleted Boundary failed.
    #[error("failed to delete the volumes of {name}: {source}")]
    Cleanup {
        /// The Boundary.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// An object could not be turned into JSON.
    #[error("failed to serialise {what}: {source}")]
    Serialise {
        /// The object.
        what: String,
        /// The error.
        source: serde_json::Error,
    },
    /// A certificate could not be issued, or the stored CA cannot be used.
    #[error("certificates of {name}: {source}")]
    Certificate {
        /// The Boundary.
        name: String,
        /// Why.
        source: crate::certificates::CertificateError,
    },
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply { .. } => "apply",
            Error::Status { .. } => "status",
            Error::Cleanup { .. } => "cleanup",
            Error::Serialise { .. } => "serialise",
            Error::Certificate { .. } => "certificate",
            // The finalizer helper wraps the reconcile's own error: report that one.
            Error::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.reason(),
                _ => "finalizer",
            },
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Operator-wide defaults.
    pub defaults: OperatorDefaults,
    /// What the API server offers.
    pub capabilities: Capabilities,
    /// True when the server serves `policy/v1` (Kubernetes ≥ 1.21); else `policy/v1beta1`.
    pub pdb_v1: bool,
    /// Publishes Events on Boundaries.
    pub recorder: Recorder,
    /// Reconcile counts, errors and durations.
    pub metrics: Arc<Metrics>,
}

impl Context {
    /// Learns what the API server offers.
    pub async fn discover(
        client: Client,
        defaults: OperatorDefaults,
        metrics: Arc<Metrics>,
    ) -> Result<Context, Error> {
        let version = client
            .apiserver_version()
            .await
            .map_err(|source| Error::Read {
                what: "the API server version".into(),
                source,
            })?;
        let minor: u32 = version
            .minor
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(0);
        let served = |api_version: &'static str| {
            let client = client.clone();
            async move { client.list_api_group_resources(api_version).await.is_ok() }
        };
        let capabilities = Capabilities {
            grpc_probes: version.major == "1" && minor >= 24,
            service_monitors: served("monitoring.coreos.com/v1").await,
        };
        let pdb_v1 = served("policy/v1").await;
        tracing::info!(
            version = %version.git_version,
            grpc_probes = capabilities.grpc_probes,
            service_monitors = capabilities.service_monitors,
            pdb_v1,
            "connected to the API server"
        );
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Ok(Context {
            client,
            defaults,
            capabilities,
            pdb_v1,
            recorder,
            metrics,
        })
    }
}

/// Runs the controller until `shutdown` completes (reconciles under way finish first): every
/// Boundary in `namespace` (all namespaces when `None`) and every StatefulSet it owns
/// trigger reconciles.
pub async fn run(
    context: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = context.client.clone();
    let (boundaries, sets): (Api<Boundary>, Api<StatefulSet>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    Controller::new(boundaries, watcher::Config::default())
        .owns(sets, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(measured_reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(boundary = %object, "reconciled"),
                Err(e) => tracing::warn!("reconcile failed: {e}"),
            }
        })
        .await;
}

fn error_policy(boundary: Arc<Boundary>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(
        boundary = %boundary.name_any(),
        namespace = boundary.namespace().unwrap_or_default(),
        reason = error.reason(),
        "failed to reconcile, retrying in {}s: {error}",
        RETRY.as_secs()
    );
    Action::requeue(RETRY)
}

/// [`reconcile`], counted and timed.
async fn measured_reconcile(
    boundary: Arc<Boundary>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile(boundary, context.clone()).await;
    context.metrics.reconciled(started, &result);
    result
}

/// One reconcile of one Boundary.
pub async fn reconcile(boundary: Arc<Boundary>, context: Arc<Context>) -> Result<Action, Error> {
    let namespace = boundary.namespace().unwrap_or_default();
    let api: Api<Boundary> = Api::namespaced(context.client.clone(), &namespace);
    finalizer(&api, FINALIZER, boundary, |event| async {
        match event {
            Finalizing::Apply(boundary) => apply(&boundary, &context).await,
            Finalizing::Cleanup(boundary) => cleanup(&boundary, &context).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

async fn apply(boundary: &Boundary, context: &Context) -> Result<Action, Error> {
    let name = boundary.name_any();
    let namespace = boundary.namespace().unwrap_or_default();
    let client = &context.client;

    // 1. Dereference.
    let (observed, running) = dereference(boundary, client, &namespace).await?;

    // 2. Validate.
    let valid = match validate::validate(boundary, &observed, &context.defaults) {
        Ok(valid) => valid,
        Err(invalid) => {
            refuse(boundary, context, &invalid, &running).await?;
            return Ok(Action::await_change());
        }
    };

    // 3. Build, with as many pods as the membership still needs.
    let plan = membership::plan(
        valid.replicas,
        running.pods(),
        running.cluster.view.as_ref(),
    );
    let generated = Generated {
        admin_password: random_secret(),
        cluster_secret: random_secret(),
    };

    // 4. Apply: the pods' certificates before the StatefulSet that mounts them, which runs
    // no pod whose certificate is not there yet.
    let mut pods = plan.pods;
    let mut awaiting_certificates = None;
    match &valid.tls {
        None => {}
        Some(Issuer::Operator) => ensure_certificates(&valid, client, plan.pods).await?,
        Some(Issuer::CertManager(issuer)) => {
            let gathered = gather_certificates(&valid, issuer, client, plan.pods).await?;
            pods = plan.pods.min(gathered.ready.max(running.pods()));
            awaiting_certificates = gathered.waiting;
        }
    }
    let objects = build::build(&valid, context.capabilities, &generated, pods);
    let set = apply_objects(&objects, client, &namespace, context.pdb_v1).await?;

    // 5. Membership sync, then status.
    if let (Some(change), Some(leader)) = (plan.change, &running.cluster.leader) {
        change_membership(boundary, context, &running, leader, change).await;
    }
    // Claims are looked at only once the membership settled (surplus volumes go) or
    // storage.size has outgrown the template's size (volumes grow): a settled Boundary
    // that never grew costs no extra request.
    let grown = observed.deployed.as_ref().is_some_and(|deployed| {
        validate::quantity_bytes(&valid.volume_size)
            > validate::quantity_bytes(&deployed.storage_size)
    });
    let claims = if plan.settled || grown {
        list_claims(&name, &namespace, client).await?
    } else {
        Vec::new()
    };
    let removed = if plan.settled {
        remove_surplus_claims(&name, &namespace, client, valid.replicas, &running, &claims).await?
    } else {
        Vec::new()
    };
    let volumes = if grown {
        let staying = claims.iter().filter(|c| {
            c.metadata
                .name
                .as_ref()
                .is_some_and(|n| !removed.contains(n))
        });
        grow_volumes(&name, &namespace, client, &valid.volume_size, staying).await?
    } else {
        Volumes::default()
    };
    if let Some(refused) = &volumes.refused {
        let already_said = boundary.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.reason == "VolumeResizeRefused")
        });
        if !already_said {
            let event = Event {
                type_: EventType::Warning,
                reason: "VolumeResizeRefused".into(),
                note: Some(format!(
                    "the volumes cannot grow to {}: {refused}",
                    valid.volume_size
                )),
                action: "GrowVolumes".into(),
                secondary: None,
            };
            publish(context, boundary, &event).await;
        }
    }
    let waiting = awaiting_certificates.is_some();
    let observation = Observation {
        cluster: summary(&name, &running.cluster, plan.settled),
        volumes,
        awaiting_certificates,
        ..observe(Some(&set), valid.replicas)
    };
    let status = status::compute(
        &name,
        &namespace,
        boundary.meta().generation,
        Ok(&observation),
        boundary.status.as_ref(),
        Timestamp::now(),
    );
    write_status(boundary, client, &status).await?;
    // Issued Secrets are not watched: while cert-manager works, look again soon.
    Ok(Action::requeue(if plan.settled && !waiting {
        RESYNC
    } else {
        MEMBERSHIP_POLL
    }))
}

/// What runs: the StatefulSet, its pods, and what they said of the Raft group.
#[derive(Default)]
struct Running {
    set: Option<StatefulSet>,
    /// Every pod of the Boundary by name, terminating or not.
    pod_names: Vec<String>,
    /// The cluster secret, once the operator has created it.
    cluster_secret: Option<String>,
    /// How to reach the pods when the Boundary has TLS (once its CA exists).
    tls: Option<cluster_api::PeerTls>,
    cluster: cluster_api::Observed,
}

impl Running {
    fn pods(&self) -> i32 {
        self.set
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.replicas)
            .unwrap_or(0)
    }
}

/// What validation needs, and what runs (whose status a refusal reports).
async fn dereference(
    boundary: &Boundary,
    client: &Client,
    namespace: &str,
) -> Result<(Observed, Running), Error> {
    let name = boundary.name_any();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let admin_secret = match &boundary.spec.admin_secret_ref {
        None => None,
        Some(reference) => Some(
            match get(&secrets, &reference.name, "the admin Secret").await? {
                None => SecretState::Missing,
                Some(secret) => SecretState::Present(
                    secret
                        .data
                        .iter()
                        .flatten()
                        .map(|(k, _)| k.clone())
                        .chain(secret.string_data.iter().flatten().map(|(k, _)| k.clone()))
                        .collect(),
                ),
            },
        ),
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let config = get(
        &config_maps,
        &build::config_map_name(&name),
        "the ConfigMap",
    )
    .await?;
    let set = get(&sets, &name, "the StatefulSet").await?;
    let observed = Observed {
        admin_secret,
        deployed: deployed(config.as_ref(), set.as_ref()),
    };
    let cluster_secret = get(
        &secrets,
        &build::cluster_secret_name(&name),
        "the cluster Secret",
    )
    .await?
    .and_then(|secret| secret.data?.remove(build::CLUSTER_SECRET_KEY))
    .and_then(|value| String::from_utf8(value.0).ok());
    let tls = match boundary.spec.tls.as_ref().map(|t| t.mode) {
        Some(TlsMode::Operator) => operator_tls(boundary, &secrets).await?,
        Some(TlsMode::CertManager) => issued_operator_tls(&name, &secrets).await?,
        None => None,
    };
    let mut running = Running {
        set,
        cluster_secret,
        tls,
        ..Running::default()
    };
    if running.set.is_some() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let listed = pods
            .list(&ListParams::default().labels(&selector(&name)))
            .await
            .map_err(|source| Error::Read {
                what: format!("the pods of {name}"),
                source,
            })?;
        let endpoints = match &running.set {
            Some(set) => cluster_api::trusted_endpoints(&name, set, &listed.items),
            None => Vec::new(),
        };
        running.pod_names = listed
            .items
            .iter()
            .filter_map(|pod| pod.metadata.name.clone())
            .collect();
        if let Some(secret) = &running.cluster_secret {
            running.cluster = cluster_api::observe(&endpoints, secret, running.tls.as_ref()).await;
        }
    }
    Ok((observed, running))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn bytes_of(secret: Option<Secret>) -> BTreeMap<String, Vec<u8>> {
    secret
        .and_then(|s| s.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// The Boundary's CA from its `<name>-ca-key` Secret; `None` before it exists.
async fn stored_authority(
    name: &str,
    secrets: &Api<Secret>,
) -> Result<Option<certificates::Authority>, Error> {
    let secret_name = certificates::ca_key_secret_name(name);
    let Some(secret) = get(secrets, &secret_name, "the CA Secret").await? else {
        return Ok(None);
    };
    let data = bytes_of(Some(secret));
    let text =
        |key: &str| String::from_utf8_lossy(data.get(key).map_or(&[][..], |v| v)).into_owned();
    certificates::Authority::from_pem(
        &text(certificates::CA_KEY_CERT),
        &text(certificates::CA_KEY_KEY),
    )
    .map(Some)
    .map_err(|source| Error::Certificate {
        name: name.to_string(),
        source,
    })
}

/// The certificate the operator presents to the pods of a TLS Boundary, issued by its CA
/// for this reconcile (no key of the operator's is stored anywhere).
async fn operator_tls(
    boundary: &Boundary,
    secrets: &Api<Secret>,
) -> Result<Option<cluster_api::PeerTls>, Error> {
    let name = boundary.name_any();
    let Some(authority) = stored_authority(&name, secrets).await? else {
        return Ok(None);
    };
    let (cert_pem, key_pem) = authority
        .issue(&["cairn-operator".to_string()], unix_now())
        .map_err(|source| Error::Certificate {
            name: name.clone(),
            source,
        })?;
    Ok(Some(cluster_api::PeerTls {
        ca_pem: authority.cert_pem.clone(),
        cert_pem,
        key_pem,
    }))
}

/// The operator's certificate of a cert-manager Boundary, as cert-manager issued it, with
/// the CAs the pods trust (`<name>-tls`, or the issued Secret's own before that exists).
async fn issued_operator_tls(
    name: &str,
    secrets: &Api<Secret>,
) -> Result<Option<cluster_api::PeerTls>, Error> {
    let issued_name = cert_manager::operator_certificate_name(name);
    let issued = bytes_of(get(secrets, &issued_name, "the operator's issued Secret").await?);
    let pods = bytes_of(
        get(
            secrets,
            &certificates::tls_secret_name(name),
            "the TLS Secret",
        )
        .await?,
    );
    let text = |data: &BTreeMap<String, Vec<u8>>, key: &str| {
        data.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let (Some(cert_pem), Some(key_pem)) = (
        text(&issued, cert_manager::ISSUED_CERT),
        text(&issued, cert_manager::ISSUED_KEY),
    ) else {
        return Ok(None);
    };
    let Some(ca_pem) =
        text(&pods, certificates::CA_CERT_KEY).or_else(|| text(&issued, certificates::CA_CERT_KEY))
    else {
        return Ok(None);
    };
    Ok(Some(cluster_api::PeerTls {
        ca_pem,
        cert_pem,
        key_pem,
    }))
}

/// Asks cert-manager for the certificates of pods `0..pods` and the operator's, and gathers
/// what it issued into `<name>-tls` (see [`cert_manager`]).
async fn gather_certificates(
    valid: &ValidBoundary,
    issuer: &CertManagerIssuer,
    client: &Client,
    pods: i32,
) -> Result<cert_manager::Gathered, Error> {
    let gvk = cert_manager::gvk();
    let resource = ApiResource::from_gvk_with_plural(&gvk, cert_manager::PLURAL);
    let certificates_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &valid.namespace, &resource);
    let wanted = (0..pods)
        .map(|ordinal| cert_manager::pod_certificate(valid, issuer, ordinal))
        .chain([cert_manager::operator_certificate(valid, issuer)]);
    for certificate in wanted {
        let name = certificate["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let applied = certificates_api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&certificate),
            )
            .await;
        match applied {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Ok(cert_manager::Gathered {
                    waiting: Some(format!(
                        "cert-manager is not installed: the API server does not serve {} Certificates",
                        cert_manager::API_VERSION
                    )),
                    ..cert_manager::Gathered::default()
                });
            }
            Err(source) => {
                return Err(Error::Apply {
                    what: format!("Certificate {name}"),
                    source,
                });
            }
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &valid.namespace);
    let mut issued = BTreeMap::new();
    for ordinal in 0..pods {
        let name = cert_manager::pod_certificate_name(&valid.name, ordinal);
        if let Some(secret) = get(&secrets, &name, "an issued Secret").await? {
            issued.insert(ordinal, bytes_of(Some(secret)));
        }
    }
    let operator = get(
        &secrets,
        &cert_manager::operator_certificate_name(&valid.name),
        "the operator's issued Secret",
    )
    .await?
    .map(|secret| bytes_of(Some(secret)));
    let tls_name = certificates::tls_secret_name(&valid.name);
    let current = bytes_of(get(&secrets, &tls_name, "the TLS Secret").await?);
    let gathered = cert_manager::gather(&valid.name, pods, &issued, operator.as_ref(), &current);
    if gathered.data != current && !gathered.data.is_empty() {
        let text = gathered
            .data
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        server_side_apply(&secrets, &build::secret(valid, tls_name, text)).await?;
        tracing::info!(
            boundary = %valid.name,
            ready = gathered.ready,
            "gathered the certificates cert-manager issued"
        );
    }
    if let Some(waiting) = &gathered.waiting {
        tracing::info!(boundary = %valid.name, "{waiting}");
    }
    Ok(gathered)
}

/// Creates the Boundary's CA once, publishes its certificate for clients, and issues the
/// certificates of pods `0..pods` that are missing or due for renewal.
async fn ensure_certificates(
    valid: &ValidBoundary,
    client: &Client,
    pods: i32,
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &valid.namespace);
    let certificate_error = |source| Error::Certificate {
        name: valid.name.clone(),
        source,
    };
    let now = unix_now();
    let authority = match stored_authority(&valid.name, &secrets).await? {
        Some(authority) => authority,
        None => {
            let fresh = certificates::Authority::generate(&valid.name, &valid.namespace, now)
                .map_err(certificate_error)?;
            let secret = build::secret(
                valid,
                certificates::ca_key_secret_name(&valid.name),
                BTreeMap::from([
                    (
                        certificates::CA_KEY_CERT.to_string(),
                        fresh.cert_pem.clone(),
                    ),
                    (
                        certificates::CA_KEY_KEY.to_string(),
                        fresh.key_pem().to_string(),
                    ),
                ]),
            );
            create_if_absent(&secrets, &secret).await?;
            // A concurrent reconcile's CA, if it won, is the one.
            stored_authority(&valid.name, &secrets)
                .await?
                .unwrap_or(fresh)
        }
    };
    server_side_apply(
        &secrets,
        &build::secret(
            valid,
            certificates::ca_secret_name(&valid.name),
            BTreeMap::from([(
                certificates::CA_CERT_KEY.to_string(),
                authority.cert_pem.clone(),
            )]),
        ),
    )
    .await?;
    let tls_name = certificates::tls_secret_name(&valid.name);
    let mut data = bytes_of(get(&secrets, &tls_name, "the TLS Secret").await?);
    let due = certificates::due(&valid.name, pods, &authority.cert_pem, &data, now);
    if due.is_empty() {
        return Ok(());
    }
    if data.get(certificates::CA_CERT_KEY).map(Vec::as_slice) != Some(authority.cert_pem.as_bytes())
    {
        data.clear();
    }
    data.insert(
        certificates::CA_CERT_KEY.to_string(),
        authority.cert_pem.clone().into_bytes(),
    );
    for ordinal in &due {
        let pod = format!("{}-{ordinal}", valid.name);
        let names = certificates::pod_names(&valid.name, &valid.namespace, *ordinal);
        let (cert, key) = authority.issue(&names, now).map_err(certificate_error)?;
        data.insert(certificates::cert_key(&pod), cert.into_bytes());
        data.insert(certificates::key_key(&pod), key.into_bytes());
    }
    let text = data
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    server_side_apply(&secrets, &build::secret(valid, tls_name, text)).await?;
    tracing::info!(boundary = %valid.name, ?due, "issued the certificates of pods");
    Ok(())
}

/// The status's view of the Raft group.
fn summary(name: &str, cluster: &cluster_api::Observed, settled: bool) -> ClusterSummary {
    let members = cluster
        .view
        .iter()
        .flat_map(|view: &ClusterView| &view.members)
        .map(|m| Member {
            id: m.node_id,
            pod: build::pod_name(name, m.node_id),
            role: if m.voter { "voter" } else { "learner" }.into(),
        })
        .collect();
    ClusterSummary {
        leader: cluster.leader.as_ref().map(|p| p.pod.clone()),
        members,
        settled,
        answered: cluster.answered,
    }
}

/// Sends one membership change to the leader. A refusal (say, a learner no longer caught
/// up) is logged and the next pass decides again.
async fn change_membership(
    boundary: &Boundary,
    context: &Context,
    running: &Running,
    leader: &PodEndpoint,
    change: Change,
) {
    let name = boundary.name_any();
    let Some(secret) = &running.cluster_secret else {
        return;
    };
    let (verb, node_id) = match change {
        Change::Promote(id) => ("promote", id),
        Change::Remove(id) => ("remove", id),
        Change::TransferLeader(id) => ("hand leadership to", id),
    };
    let target = build::pod_name(&name, node_id);
    let result = async {
        cluster_api::Node::connect(leader, secret, running.tls.as_ref())
            .await?
            .change(change)
            .await
    }
    .await;
    match result {
        Ok(()) => {
            tracing::info!(boundary = %name, leader = %leader.pod, "membership: {verb} node {node_id} ({target})");
            let event = Event {
                type_: EventType::Normal,
                reason: "MembershipChanged".into(),
                note: Some(format!("{verb} node {node_id} ({target})")),
                action: "ChangeMembership".into(),
                secondary: None,
            };
            publish(context, boundary, &event).await;
        }
        Err(e) => tracing::warn!(
            boundary = %name,
            "failed to {verb} node {node_id} ({target}), deciding again in {}s: {e}",
            MEMBERSHIP_POLL.as_secs()
        ),
    }
}

/// Once the membership has shrunk and the surplus pods are gone, their volumes go too: they
/// hold nothing the remaining nodes lack, and a node started again on one would come back
/// with the membership it has left. (`volumeReclaimPolicy` governs deleting the Boundary.)
async fn remove_surplus_claims(
    name: &str,
    namespace: &str,
    client: &Client,
    replicas: i32,
    running: &Running,
    listed: &[PersistentVolumeClaim],
) -> Result<Vec<String>, Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let mut removed = Vec::new();
    for claim in listed {
        let Some(claim_name) = claim.metadata.name.clone() else {
            continue;
        };
        let Some(pod) = claim_name.strip_prefix(&format!("{}-", build::DATA_CLAIM)) else {
            continue;
        };
        let surplus = build::pod_ordinal(name, pod).is_some_and(|ordinal| ordinal >= replicas);
        if !surplus
            || running.pod_names.iter().any(|p| p == pod)
            || claim.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        claims
            .delete(&claim_name, &DeleteParams::default())
            .await
            .map_err(|source| Error::Cleanup {
                name: name.to_string(),
                source,
            })?;
        tracing::info!(boundary = %name, %namespace, claim = %claim_name, "deleted the volume of a node that left");
        removed.push(claim_name);
    }
    Ok(removed)
}

/// Every PersistentVolumeClaim of Boundary `name` (the StatefulSet's claims carry its
/// selector labels).
async fn list_claims(
    name: &str,
    namespace: &str,
    client: &Client,
) -> Result<Vec<PersistentVolumeClaim>, Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    claims
        .list(&ListParams::default().labels(&selector(name)))
        .await
        .map(|list| list.items)
        .map_err(|source| Error::Read {
            what: format!("the volumes of {name}"),
            source,
        })
}

/// Asks every claim of Boundary `name` smaller than `wanted` to grow to it (the claim
/// template cannot change, so each claim is patched; the storage driver and the kubelet do
/// the resize), and reports how many are still growing. A refusal by the API server (the
/// storage class does not allow expansion, or the claim is not bound) is reported, not
/// retried as an error: it needs a change by the user.
async fn grow_volumes(
    name: &str,
    namespace: &str,
    client: &Client,
    wanted: &str,
    listed: impl Iterator<Item = &PersistentVolumeClaim>,
) -> Result<Volumes, Error> {
    let mut volumes = Volumes {
        wanted: wanted.to_string(),
        ..Volumes::default()
    };
    let Some(wanted_bytes) = validate::quantity_bytes(wanted) else {
        return Ok(volumes);
    };
    let storage = |resources: Option<&BTreeMap<String, Quantity>>| {
        resources
            .and_then(|r| r.get("storage"))
            .and_then(|q| validate::quantity_bytes(&q.0))
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    for claim in listed {
        let Some(claim_name) = claim.metadata.name.clone() else {
            continue;
        };
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let requested = storage(
            claim
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        );
        if requested.is_some_and(|r| r < wanted_bytes) {
            let patch = serde_json::json!({
                "spec": {"resources": {"requests": {"storage": wanted}}}
            });
            match claims
                .patch(&claim_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(boundary = %name, %namespace, claim = %claim_name, "asked the volume to grow to {wanted}");
                }
                Err(kube::Error::Api(status)) if matches!(status.code, 403 | 422) => {
                    tracing::warn!(boundary = %name, %namespace, claim = %claim_name, "the API server refused to grow the volume to {wanted}: {}", status.message);
                    volumes.refused = Some(format!("{claim_name}: {}", status.message));
                    continue;
                }
                Err(source) => {
                    return Err(Error::Apply {
                        what: format!("the size of PersistentVolumeClaim {claim_name}"),
                        source,
                    });
                }
            }
        }
        // Capacity is what the volume has; a claim not yet bound has none to compare.
        let capacity = storage(claim.status.as_ref().and_then(|s| s.capacity.as_ref()));
        if capacity.is_some_and(|c| c < wanted_bytes) {
            volumes.growing += 1;
        }
    }
    Ok(volumes)
}

fn selector(name: &str) -> String {
    build::selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What runs, read back from the objects a previous reconcile applied.
fn deployed(config: Option<&ConfigMap>, set: Option<&StatefulSet>) -> Option<Deployed> {
    let data = config?.data.as_ref()?;
    let claim = set?
        .spec
        .as_ref()?
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?;
    Some(Deployed {
        initial_replicas: data.get("CAIRN_INITIAL_MEMBERS")?.split(',').count() as i32,
        boundary_name: data.get("CAIRN_BOUNDARIES")?.clone(),
        storage_size: claim
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")?
            .0
            .clone(),
        volume_size: set?
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(build::VOLUME_SIZE_ANNOTATION))
            .cloned(),
        storage_class_name: claim.storage_class_name.clone(),
        idempotent_event_ids: data
            .get(build::IDEMPOTENT_BOUNDARIES_KEY)
            .is_some_and(|names| !names.is_empty()),
        tls: if data.contains_key(build::PEER_TLS_CA_KEY) {
            build::tls_mode_named(
                set?.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(build::TLS_ISSUER_ANNOTATION))
                    .map(String::as_str),
            )
        } else {
            None
        },
    })
}

/// The StatefulSet's part of the observation (the cluster's is added by the caller).
fn observe(set: Option<&StatefulSet>, replicas: i32) -> Observation {
    let status = set.and_then(|s| s.status.as_ref());
    let generation = set.and_then(|s| s.metadata.generation);
    Observation {
        replicas,
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        rolled_out: status.is_some_and(|s| {
            s.observed_generation == generation
                && s.current_revision == s.update_revision
                && s.updated_replicas.unwrap_or(0) >= replicas
        }),
        cluster: ClusterSummary::default(),
        volumes: Volumes::default(),
        awaiting_certificates: None,
    }
}

/// Publishes `event` on `boundary`. Events are a courtesy (the status and the logs say the
/// same), so a failure is logged, not returned.
async fn publish(context: &Context, boundary: &Boundary, event: &Event) {
    if let Err(e) = context
        .recorder
        .publish(event, &boundary.object_ref(&()))
        .await
    {
        tracing::warn!(boundary = %boundary.name_any(), reason = %event.reason, "failed to publish an Event: {e}");
    }
}

/// An invalid spec: a Warning Event and the status say why; nothing is applied.
async fn refuse(
    boundary: &Boundary,
    context: &Context,
    invalid: &Invalid,
    running: &Running,
) -> Result<(), Error> {
    let name = boundary.name_any();
    let namespace = boundary.namespace().unwrap_or_default();
    tracing::warn!(boundary = %name, %namespace, "refusing the spec: {invalid}");
    let event = Event {
        type_: EventType::Warning,
        reason: invalid.reason.to_string(),
        note: Some(invalid.message.clone()),
        action: "Validate".into(),
        secondary: None,
    };
    publish(context, boundary, &event).await;
    let observation = running.set.as_ref().map(|set| {
        let pods = running.pods();
        let settled = membership::plan(pods, pods, running.cluster.view.as_ref()).settled;
        Observation {
            cluster: summary(&name, &running.cluster, settled),
            ..observe(Some(set), pods)
        }
    });
    let status = status::compute(
        &name,
        &namespace,
        boundary.meta().generation,
        Err((invalid, observation.as_ref())),
        boundary.status.as_ref(),
        Timestamp::now(),
    );
    write_status(boundary, &context.client, &status).await
}

async fn apply_objects(
    objects: &Objects,
    client: &Client,
    namespace: &str,
    pdb_v1: bool,
) -> Result<StatefulSet, Error> {
    // Generated secrets first, and only once: a new password on every reconcile would lock
    // the nodes out of their own admin user.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for secret in objects.admin_secret.iter().chain([&objects.cluster_secret]) {
        create_if_absent(&secrets, secret).await?;
    }
    server_side_apply(
        &Api::<ConfigMap>::namespaced(client.clone(), namespace),
        &objects.config_map,
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    server_side_apply(&services, &objects.peer_service).await?;
    server_side_apply(&services, &objects.client_service).await?;
    let set = server_side_apply(
        &Api::<StatefulSet>::namespaced(client.clone(), namespace),
        &objects.stateful_set,
    )
    .await?;
    if pdb_v1 {
        server_side_apply(
            &Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace),
            &objects.pod_disruption_budget,
        )
        .await?;
    } else {
        // Kubernetes 1.20 serves PodDisruptionBudgets only as policy/v1beta1, whose fields
        // used here are the same.
        let mut pdb = to_json(&objects.pod_disruption_budget, "the PodDisruptionBudget")?;
        pdb["apiVersion"] = "policy/v1beta1".into();
        let gvk = GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget");
        apply_dynamic(client, namespace, &gvk, "poddisruptionbudgets", pdb).await?;
    }
    if let Some(monitor) = &objects.service_monitor {
        let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
        apply_dynamic(client, namespace, &gvk, "servicemonitors", monitor.clone()).await?;
    }
    if let Some(policy) = &objects.network_policy {
        server_side_apply(
            &Api::<NetworkPolicy>::namespaced(client.clone(), namespace),
            policy,
        )
        .await?;
    }
    Ok(set)
}

fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{} {}",
        K::kind(&()),
        object.meta().name.as_deref().unwrap_or("?")
    )
}

fn to_json<T: Serialize>(object: &T, what: &str) -> Result<serde_json::Value, Error> {
    serde_json::to_value(object).map_err(|source| Error::Serialise {
        what: what.into(),
        source,
    })
}

/// Applies `object`; the server's answer is the object as stored, status included.
async fn server_side_apply<K>(api: &Api<K>, object: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|source| Error::Apply {
        what: describe(object),
        source,
    })
}

async fn apply_dynamic(
    client: &Client,
    namespace: &str,
    gvk: &GroupVersionKind,
    plural: &str,
    object: serde_json::Value,
) -> Result<(), Error> {
    let resource = ApiResource::from_gvk_with_plural(gvk, plural);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Apply {
        what: format!("{} {name}", gvk.kind),
        source,
    })
}

async fn create_if_absent(api: &Api<Secret>, secret: &Secret) -> Result<(), Error> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    if get(api, &name, "a Secret").await?.is_some() {
        return Ok(());
    }
    match api.create(&PostParams::default(), secret).await {
        Ok(_) => Ok(()),
        // Another reconcile created it in between: theirs stands.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(Error::Apply {
            what: describe(secret),
            source,
        }),
    }
}

async fn get<K>(api: &Api<K>, name: &str, what: &str) -> Result<Option<K>, Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map_err(|source| Error::Read {
        what: format!("{what} {name}"),
        source,
    })
}

async fn write_status(
    boundary: &Boundary,
    client: &Client,
    status: &BoundaryStatus,
) -> Result<(), Error> {
    if boundary.status.as_ref() == Some(status) {
        return Ok(());
    }
    let name = boundary.name_any();
    let api: Api<Boundary> =
        Api::namespaced(client.clone(), &boundary.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "Boundary",
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Status { name, source })
}

/// A deleted Boundary: owner references let the garbage collector remove every object; the
/// volumes (which the StatefulSet's claims created, not the operator) go only on request.
async fn cleanup(boundary: &Boundary, context: &Context) -> Result<Action, Error> {
    let name = boundary.name_any();
    if boundary.spec.volume_reclaim_policy == VolumeReclaimPolicy::Delete {
        let namespace = boundary.namespace().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(context.client.clone(), &namespace);
        claims
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector(&name)),
            )
            .await
            .map_err(|source| Error::Cleanup {
                name: name.clone(),
                source,
            })?;
        tracing::info!(boundary = %name, %namespace, "deleted the volumes (volumeReclaimPolicy: Delete)");
    }
    Ok(Action::await_change())
}

fn random_secret() -> String {
    rand::thread_rng()
        .sample_iter(rand::distributions::Alphanumeric)
        .take(GENERATED_SECRET_LEN)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod api_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::ValidBoundary;

    fn valid() -> ValidBoundary {
        ValidBoundary {
            name: "orders".into(),
            namespace: "shop".into(),
            uid: "uid-1".into(),
            boundary_name: "orders".into(),
            replicas: 5,
            initial_replicas: 3,
            image: "cairn:test".into(),
            storage_size: "20Gi".into(),
            volume_size: "30Gi".into(),
            storage_class_name: Some("fast".into()),
            idempotent_event_ids: true,
            resources: None,
            admin_secret: "orders-admin".into(),
            generate_admin_secret: true,
            placement: Default::default(),
            service_monitor: false,
            volume_reclaim_policy: VolumeReclaimPolicy::Retain,
            network_policy: None,
            tls: None,
        }
    }

    #[test]
    fn what_runs_is_read_back_from_the_objects_the_build_made() {
        let objects = build::build(
            &valid(),
            Capabilities::default(),
            &Generated {
                admin_password: "pw".into(),
                cluster_secret: "s".repeat(20),
            },
            5,
        );
        let read =
            deployed(Some(&objects.config_map), Some(&objects.stateful_set)).expect("deployed");
        assert_eq!(
            read,
            Deployed {
                initial_replicas: 3,
                boundary_name: "orders".into(),
                storage_size: "20Gi".into(),
                volume_size: Some("30Gi".into()),
                storage_class_name: Some("fast".into()),
                idempotent_event_ids: true,
                tls: None,
            }
        );
        assert_eq!(deployed(None, Some(&objects.stateful_set)), None);
        let plain = build::build(
            &ValidBoundary {
                idempotent_event_ids: false,
                tls: None,
                ..valid()
            },
            Capabilities::default(),
            &Generated {
                admin_password: "pw".into(),
                cluster_secret: "s".repeat(20),
            },
            5,
        );
        let read = deployed(Some(&plain.config_map), Some(&plain.stateful_set)).expect("deployed");
        assert!(!read.idempotent_event_ids);
    }

    #[test]
    fn generated_secrets_are_long_and_differ() {
        let (a, b) = (random_secret(), random_secret());
        assert_eq!(a.len(), GENERATED_SECRET_LEN);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
