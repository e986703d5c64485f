//! Step two of a reconcile: is the declared spec one the operator can apply, given what the
//! cluster already runs? Pure: everything it needs was read in the dereference step. An
//! invalid spec is reported (condition and Event) and nothing is applied.

use std::fmt;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::crd::{Boundary, PlacementSpec, TlsMode, TlsSpec, VolumeReclaimPolicy};

/// Voter counts a Boundary may have. Even counts are refused: four voters need three for a
/// quorum and so survive one failure, like three.
pub const ALLOWED_REPLICAS: [i32; 3] = [1, 3, 5];
/// Keys the admin Secret must hold.
pub const ADMIN_SECRET_KEYS: [&str; 2] = ["username", "password"];

/// What the dereference step found for one Boundary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// The Secret `adminSecretRef` names: `None` when no reference is given.
    pub admin_secret: Option<SecretState>,
    /// What the operator applied before (read back from the StatefulSet), if anything.
    pub deployed: Option<Deployed>,
}

/// A referenced Secret, as found.
#[derive(Clone, Debug, PartialEq)]
pub enum SecretState {
    /// No such Secret in the namespace.
    Missing,
    /// The Secret exists; these are its data keys.
    Present(Vec<String>),
}

/// The settings of a running cluster that a spec change must respect.
#[derive(Clone, Debug, PartialEq)]
pub struct Deployed {
    /// The voters the cluster was formed with (`--initial-members`); fixed for its life, so
    /// that scaling never rewrites the pod template.
    pub initial_replicas: i32,
    /// The boundary the cluster serves.
    pub boundary_name: String,
    /// The volume size in the StatefulSet's claim template (immutable: the size the
    /// cluster was created with).
    pub storage_size: String,
    /// The size the claims were last asked to grow to (the StatefulSet's
    /// `cairn.dev/volume-size` annotation), when it differs from the template's.
    pub volume_size: Option<String>,
    /// The storage class in the claim template.
    pub storage_class_name: Option<String>,
    /// Whether the boundary was declared with idempotent event ids (fixed at creation).
    pub idempotent_event_ids: bool,
    /// Who issues the nodes' certificates, when they speak TLS (fixed at creation).
    pub tls: Option<TlsMode>,
}

impl Deployed {
    /// The size the volumes have or are growing to.
    pub fn current_volume_size(&self) -> &str {
        self.volume_size.as_deref().unwrap_or(&self.storage_size)
    }
}

/// Settings that come from the operator rather than the resource.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorDefaults {
    /// Image for Boundaries that do not name one.
    pub image: String,
    /// Where the operator's own pods run, when each Boundary gets a NetworkPolicy that
    /// admits only them and the Boundary's pods to the peer port; `None`: no policy.
    pub network_policy: Option<OperatorPods>,
}

/// The operator's pods, as a NetworkPolicy selects them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorPods {
    /// Their namespace (selected by its `kubernetes.io/metadata.name` label).
    pub namespace: String,
    /// Labels every operator pod carries.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A spec the operator can apply, with every default filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidBoundary {
    /// The resource's name (prefix of every object built for it).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its uid (owner references).
    pub uid: String,
    /// The boundary inside Cairn.
    pub boundary_name: String,
    /// Voters wanted now.
    pub replicas: i32,
    /// Voters the cluster was (or will be) formed with.
    pub initial_replicas: i32,
    /// Container image.
    pub image: String,
    /// Volume size in the claim template (a Kubernetes quantity): the size new volumes are
    /// created with; once the StatefulSet exists, the size it was created with (the
    /// template cannot change).
    pub storage_size: String,
    /// The size every volume should have (`storage.size`); above `storage_size` once the
    /// volumes were grown, and then each claim is resized to it.
    pub volume_size: String,
    /// Storage class.
    pub storage_class_name: Option<String>,
    /// The boundary is declared with idempotent event ids (X1).
    pub idempotent_event_ids: bool,
    /// Container resources.
    pub resources: Option<ResourceRequirements>,
    /// The admin Secret's name, and whether the operator generates it.
    pub admin_secret: String,
    /// True when the operator creates the admin Secret (no `adminSecretRef`).
    pub generate_admin_secret: bool,
    /// Pod placement.
    pub placement: PlacementSpec,
    /// Create a ServiceMonitor.
    pub service_monitor: bool,
    /// What deletion does to the volumes.
    pub volume_reclaim_policy: VolumeReclaimPolicy,
    /// The operator's pods, when the Boundary gets a NetworkPolicy.
    pub network_policy: Option<OperatorPods>,
    /// Who issues the nodes' certificates, when they speak TLS.
    pub tls: Option<Issuer>,
}

/// Who issues the certificates of a TLS Boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Issuer {
    /// The operator, from the Boundary's own CA.
    Operator,
    /// cert-manager, from this issuer.
    CertManager(CertManagerIssuer),
}

impl Issuer {
    /// The mode the spec names.
    pub fn mode(&self) -> TlsMode {
        match self {
            Issuer::Operator => TlsMode::Operator,
            Issuer::CertManager(_) => TlsMode::CertManager,
        }
    }
}

/// A cert-manager issuer with its defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertManagerIssuer {
    /// Its name.
    pub name: String,
    /// `Issuer`, `ClusterIssuer`, or an external issuer's kind.
    pub kind: String,
    /// Its API group.
    pub group: String,
}

/// cert-manager's own API group, the default of `issuerRef.group`.
pub const CERT_MANAGER_GROUP: &str = "cert-manager.io";

/// Why a spec was refused: the condition's reason and a message for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Machine-readable reason (the condition's `reason`).
    pub reason: InvalidReason,
    /// What is wrong and what to do about it.
    pub message: String,
}

/// The ways a spec can be refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidReason {
    /// The resource lacks a name, namespace or uid (not yet stored by the API server).
    IncompleteResource,
    /// `replicas` is not 1, 3 or 5.
    UnsupportedReplicas,
    /// `boundaryName` (or the name derived from the resource) is not a Cairn boundary name.
    InvalidBoundaryName,
    /// `storage.size` is not a quantity.
    InvalidStorageSize,
    /// `storage.size` is smaller than the volumes already have.
    StorageShrink,
    /// A field that is fixed at creation was changed.
    ImmutableField,
    /// `adminSecretRef` names a Secret that does not exist.
    AdminSecretMissing,
    /// The admin Secret lacks `username` or `password`.
    AdminSecretIncomplete,
    /// `tls` is inconsistent.
    InvalidTls,
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidReason::IncompleteResource => "IncompleteResource",
            InvalidReason::UnsupportedReplicas => "UnsupportedReplicas",
            InvalidReason::InvalidBoundaryName => "InvalidBoundaryName",
            InvalidReason::InvalidStorageSize => "InvalidStorageSize",
            InvalidReason::StorageShrink => "StorageShrink",
            InvalidReason::ImmutableField => "ImmutableField",
            InvalidReason::AdminSecretMissing => "AdminSecretMissing",
            InvalidReason::AdminSecretIncomplete => "AdminSecretIncomplete",
            InvalidReason::InvalidTls => "InvalidTls",
        })
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

fn invalid(reason: InvalidReason, message: impl Into<String>) -> Invalid {
    Invalid {
        reason,
        message: message.into(),
    }
}

/// The boundary a resource serves when `boundaryName` is absent: Kubernetes names allow `-`,
/// Cairn's boundary names do not.
pub fn default_boundary_name(resource_name: &str) -> String {
    resource_name.replace('-', "_")
}

/// `spec.tls`, checked: `issuerRef` goes with `certManager` and only with it.
fn valid_issuer(tls: &TlsSpec) -> Result<Issuer, Invalid> {
    match (tls.mode, &tls.issuer_ref) {
        (TlsMode::Operator, None) => Ok(Issuer::Operator),
        (TlsMode::Operator, Some(_)) => Err(invalid(
            InvalidReason::InvalidTls,
            "tls.issuerRef goes with mode certManager; mode operator issues the certificates itself",
        )),
        (TlsMode::CertManager, None) => Err(invalid(
            InvalidReason::InvalidTls,
            "tls mode certManager needs issuerRef: the cert-manager Issuer or ClusterIssuer that signs the nodes' certificates",
        )),
        (TlsMode::CertManager, Some(reference)) => {
            if reference.name.is_empty() {
                return Err(invalid(
                    InvalidReason::InvalidTls,
                    "tls.issuerRef.name is empty",
                ));
            }
            let group = reference
                .group
                .clone()
                .filter(|g| !g.is_empty())
                .unwrap_or_else(|| CERT_MANAGER_GROUP.to_string());
            let kind = reference
                .kind
                .clone()
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| "Issuer".to_string());
            if group == CERT_MANAGER_GROUP && kind != "Issuer" && kind != "ClusterIssuer" {
                return Err(invalid(
                    InvalidReason::InvalidTls,
                    format!(
                        "tls.issuerRef.kind {kind:?} is not a cert-manager issuer: use Issuer or ClusterIssuer (or set group for an external issuer)"
                    ),
                ));
            }
            Ok(Issuer::CertManager(CertManagerIssuer {
                name: reference.name.clone(),
                kind,
                group,
            }))
        }
    }
}

/// Checks `boundary` against what runs, filling in defaults.
pub fn validate(
    boundary: &Boundary,
    observed: &Observed,
    defaults: &OperatorDefaults,
) -> Result<ValidBoundary, Invalid> {
    let meta = &boundary.metadata;
    let (Some(name), Some(namespace), Some(uid)) = (&meta.name, &meta.namespace, &meta.uid) else {
        return Err(invalid(
            InvalidReason::IncompleteResource,
            "the resource has no name, namespace or uid yet",
        ));
    };
    let spec = &boundary.spec;

    if !ALLOWED_REPLICAS.contains(&spec.replicas) {
        return Err(invalid(
            InvalidReason::UnsupportedReplicas,
            format!(
                "replicas must be 1, 3 or 5, not {}: a Raft group of {} voters survives no more failures than one of {}",
                spec.replicas,
                spec.replicas,
                spec.replicas - 1
            ),
        ));
    }

    let boundary_name = spec
        .boundary_name
        .clone()
        .unwrap_or_else(|| default_boundary_name(name));
    if let Err(e) = cairn_core::boundary::validate_boundary_name(&boundary_name) {
        let hint = if spec.boundary_name.is_none() {
            " (derived from the resource's name; set spec.boundaryName)"
        } else {
            ""
        };
        return Err(invalid(
            InvalidReason::InvalidBoundaryName,
            format!("{e}{hint}"),
        ));
    }

    let Some(size) = quantity_bytes(&spec.storage.size) else {
        return Err(invalid(
            InvalidReason::InvalidStorageSize,
            format!(
                "storage.size {:?} is not a Kubernetes quantity such as 10Gi",
                spec.storage.size
            ),
        ));
    };

    let tls = match &spec.tls {
        None => None,
        Some(tls) => Some(valid_issuer(tls)?),
    };
    if let Some(deployed) = &observed.deployed {
        let wanted = tls.as_ref().map(Issuer::mode);
        if deployed.tls != wanted {
            let mode = |m: Option<TlsMode>| match m {
                None => "off",
                Some(TlsMode::Operator) => "mode operator",
                Some(TlsMode::CertManager) => "mode certManager",
            };
            return Err(invalid(
                InvalidReason::ImmutableField,
                format!(
                    "tls cannot change from {} to {} on a running Boundary: during the change the nodes would not trust each other's certificates; create a new Boundary",
                    mode(deployed.tls),
                    mode(wanted)
                ),
            ));
        }
    }

    let mut initial_replicas = spec.replicas;
    // The claim template is immutable: once it exists, growing happens claim by claim.
    let mut template_size = spec.storage.size.clone();
    if let Some(deployed) = &observed.deployed {
        initial_replicas = deployed.initial_replicas;
        template_size = deployed.storage_size.clone();
        if deployed.boundary_name != boundary_name {
            return Err(invalid(
                InvalidReason::ImmutableField,
                format!(
                    "the cluster serves boundary {:?}; boundaryName cannot change to {:?}",
                    deployed.boundary_name, boundary_name
                ),
            ));
        }
        if deployed.idempotent_event_ids != spec.idempotent_event_ids {
            return Err(invalid(
                InvalidReason::ImmutableField,
                format!(
                    "the boundary was created with idempotentEventIds {}; the option is fixed at creation and cannot change",
                    deployed.idempotent_event_ids
                ),
            ));
        }
        if deployed.storage_class_name != spec.storage.storage_class_name {
            return Err(invalid(
                InvalidReason::ImmutableField,
                format!(
                    "the volumes use storage class {:?}; storage.storageClassName cannot change",
                    deployed
                        .storage_class_name
                        .as_deref()
                        .unwrap_or("(default)")
                ),
            ));
        }
        // A size the operator wrote itself always parses; compare only when it does.
        let current = deployed.current_volume_size();
        if let Some(current_bytes) = quantity_bytes(current)
            && size < current_bytes
        {
            return Err(invalid(
                InvalidReason::StorageShrink,
                format!(
                    "storage.size {} is smaller than the volumes' {current}: volumes cannot shrink",
                    spec.storage.size
                ),
            ));
        }
    }

    let (admin_secret, generate_admin_secret) = match (
        &spec.admin_secret_ref,
        &observed.admin_secret,
    ) {
        (None, _) => (format!("{name}-admin"), true),
        (Some(r), None | Some(SecretState::Missing)) => {
            return Err(invalid(
                InvalidReason::AdminSecretMissing,
                format!(
                    "adminSecretRef names Secret {:?}, which does not exist in namespace {namespace}",
                    r.name
                ),
            ));
        }
        (Some(r), Some(SecretState::Present(keys))) => {
            let missing: Vec<_> = ADMIN_SECRET_KEYS
                .iter()
                .filter(|k| !keys.iter().any(|have| have == *k))
                .collect();
            if !missing.is_empty() {
                return Err(invalid(
                    InvalidReason::AdminSecretIncomplete,
                    format!(
                        "Secret {:?} lacks the key(s) {missing:?}; it needs username and password",
                        r.name
                    ),
                ));
            }
            (r.name.clone(), false)
        }
    };

    Ok(ValidBoundary {
        name: name.clone(),
        namespace: namespace.clone(),
        uid: uid.clone(),
        boundary_name,
        replicas: spec.replicas,
        initial_replicas,
        image: spec.image.clone().unwrap_or_else(|| defaults.image.clone()),
        storage_size: template_size,
        volume_size: spec.storage.size.clone(),
        storage_class_name: spec.storage.storage_class_name.clone(),
        idempotent_event_ids: spec.idempotent_event_ids,
        resources: spec.resources.clone(),
        admin_secret,
        generate_admin_secret,
        placement: spec.placement.clone(),
        service_monitor: spec.monitoring.service_monitor,
        volume_reclaim_policy: spec.volume_reclaim_policy,
        network_policy: defaults.network_policy.clone(),
        tls,
    })
}

/// Bytes in a Kubernetes quantity (`10Gi`, `500M`, `1.5Ti`, `1e9`), or `None` when it is not
/// one. Fractions of a byte round up, as the API server does.
pub fn quantity_bytes(quantity: &str) -> Option<u128> {
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return None;
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let (multiplier, exponent): (u128, u32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse().ok().filter(|e| *e <= 30)?),
        _ => return None,
    };
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let scale = 10u128.checked_pow(fraction.len() as u32)?;
    let numerator = digits
        .checked_mul(multiplier)?
        .checked_mul(10u128.checked_pow(exponent)?)?;
    Some(numerator.div_ceil(scale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::BoundarySpec;
    use kube::api::ObjectMeta;

    fn boundary(spec_yaml: &str) -> Boundary {
        let spec: BoundarySpec = serde_saphyr::from_str(spec_yaml).expect("spec");
        Boundary {
            metadata: ObjectMeta {
                name: Some("orders-eu".into()),
                namespace: Some("shop".into()),
                uid: Some("uid-1".into()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    fn defaults() -> OperatorDefaults {
        OperatorDefaults {
            image: "cairn:test".into(),
            network_policy: None,
        }
    }

    fn reason(spec_yaml: &str, observed: &Observed) -> InvalidReason {
        validate(&boundary(spec_yaml), observed, &defaults())
            .expect_err("invalid")
            .reason
    }

    fn deployed() -> Deployed {
        Deployed {
            initial_replicas: 3,
            boundary_name: "orders_eu".into(),
            storage_size: "10Gi".into(),
            volume_size: None,
            storage_class_name: None,
            idempotent_event_ids: false,
            tls: None,
        }
    }

    #[test]
    fn a_minimal_spec_is_valid_with_every_default_filled_in() {
        let valid = validate(&boundary("{}"), &Observed::default(), &defaults()).expect("valid");
        assert_eq!(valid.boundary_name, "orders_eu");
        assert_eq!(valid.replicas, 3);
        assert_eq!(valid.initial_replicas, 3);
        assert_eq!(valid.image, "cairn:test");
        assert_eq!(valid.storage_size, "10Gi");
        assert_eq!(valid.admin_secret, "orders-eu-admin");
        assert!(valid.generate_admin_secret);
    }

    #[test]
    fn replicas_other_than_one_three_or_five_are_refused() {
        for replicas in [0, 2, 4, 6, -1] {
            assert_eq!(
                reason(&format!("replicas: {replicas}"), &Observed::default()),
                InvalidReason::UnsupportedReplicas,
                "replicas {replicas}"
            );
        }
        for replicas in ALLOWED_REPLICAS {
            validate(
                &boundary(&format!("replicas: {replicas}")),
                &Observed::default(),
                &defaults(),
            )
            .expect("valid");
        }
    }

    #[test]
    fn the_boundary_name_must_be_a_cairn_name() {
        assert_eq!(
            reason("boundaryName: 9orders", &Observed::default()),
            InvalidReason::InvalidBoundaryName
        );
        let mut b = boundary("{}");
        b.metadata.name = Some("1st".into());
        let err = validate(&b, &Observed::default(), &defaults()).expect_err("invalid");
        assert_eq!(err.reason, InvalidReason::InvalidBoundaryName);
        assert!(err.message.contains("set spec.boundaryName"), "{err}");
    }

    #[test]
    fn volumes_grow_but_never_shrink_or_change_class() {
        let observed = Observed {
            deployed: Some(deployed()),
            ..Observed::default()
        };
        assert_eq!(
            reason("storage: {size: 5Gi}", &observed),
            InvalidReason::StorageShrink
        );
        assert_eq!(
            reason("storage: {size: 10Gi, storageClassName: fast}", &observed),
            InvalidReason::ImmutableField
        );
        assert_eq!(
            reason("storage: {size: lots}", &observed),
            InvalidReason::InvalidStorageSize
        );
        let same = validate(
            &boundary("storage: {size: 10240Mi}"),
            &observed,
            &defaults(),
        )
        .expect("the same size, spelled otherwise");
        assert_eq!(same.storage_size, "10Gi", "the template stays");
        assert_eq!(same.volume_size, "10240Mi");
        // 10G (decimal) is less than 10Gi (binary).
        assert_eq!(
            reason("storage: {size: 10G}", &observed),
            InvalidReason::StorageShrink
        );

        // Growing: the template keeps the size it was created with, the claims grow.
        let grown = validate(&boundary("storage: {size: 20Gi}"), &observed, &defaults())
            .expect("volumes may grow");
        assert_eq!(
            (grown.storage_size.as_str(), grown.volume_size.as_str()),
            ("10Gi", "20Gi")
        );
        // Once grown, shrinking is measured against the grown size, not the template's.
        let after_growing = Observed {
            deployed: Some(Deployed {
                volume_size: Some("20Gi".into()),
                ..deployed()
            }),
            ..Observed::default()
        };
        let shrink = validate(
            &boundary("storage: {size: 15Gi}"),
            &after_growing,
            &defaults(),
        )
        .expect_err("15Gi is below the grown 20Gi");
        assert_eq!(shrink.reason, InvalidReason::StorageShrink);
        assert!(
            shrink.message.contains("volumes' 20Gi"),
            "{}",
            shrink.message
        );
        validate(
            &boundary("storage: {size: 20Gi}"),
            &after_growing,
            &defaults(),
        )
        .expect("unchanged");
    }

    #[test]
    fn a_running_cluster_keeps_its_boundary_and_initial_members() {
        let observed = Observed {
            deployed: Some(deployed()),
            ..Observed::default()
        };
        assert_eq!(
            reason("boundaryName: payments", &observed),
            InvalidReason::ImmutableField
        );
        let scaled = validate(&boundary("replicas: 5"), &observed, &defaults()).expect("valid");
        assert_eq!((scaled.replicas, scaled.initial_replicas), (5, 3));
    }

    #[test]
    fn a_referenced_admin_secret_must_exist_with_both_keys() {
        let spec = "adminSecretRef: {name: orders-creds}";
        assert_eq!(
            reason(spec, &Observed::default()),
            InvalidReason::AdminSecretMissing
        );
        let missing = Observed {
            admin_secret: Some(SecretState::Missing),
            ..Observed::default()
        };
        assert_eq!(reason(spec, &missing), InvalidReason::AdminSecretMissing);
        let partial = Observed {
            admin_secret: Some(SecretState::Present(vec!["username".into()])),
            ..Observed::default()
        };
        assert_eq!(reason(spec, &partial), InvalidReason::AdminSecretIncomplete);
        let complete = Observed {
            admin_secret: Some(SecretState::Present(vec![
                "password".into(),
                "username".into(),
            ])),
            ..Observed::default()
        };
        let valid = validate(&boundary(spec), &complete, &defaults()).expect("valid");
        assert_eq!(valid.admin_secret, "orders-creds");
        assert!(!valid.generate_admin_secret);
    }

    #[test]
    fn idempotent_event_ids_are_fixed_at_creation() {
        let fresh = validate(
            &boundary("idempotentEventIds: true"),
            &Observed::default(),
            &defaults(),
        )
        .expect("valid");
        assert!(fresh.idempotent_event_ids);
        let plain = Observed {
            deployed: Some(deployed()),
            ..Observed::default()
        };
        let err = validate(&boundary("idempotentEventIds: true"), &plain, &defaults())
            .expect_err("the option cannot be turned on later");
        assert_eq!(err.reason, InvalidReason::ImmutableField);
        assert!(
            err.message.contains("idempotentEventIds false"),
            "{}",
            err.message
        );
        let idempotent = Observed {
            deployed: Some(Deployed {
                idempotent_event_ids: true,
                tls: None,
                ..deployed()
            }),
            ..Observed::default()
        };
        assert_eq!(reason("{}", &idempotent), InvalidReason::ImmutableField);
        assert!(
            validate(
                &boundary("idempotentEventIds: true"),
                &idempotent,
                &defaults()
            )
            .is_ok()
        );
    }

    #[test]
    fn tls_by_the_operator_is_valid_and_fixed_at_creation() {
        let valid = validate(
            &boundary("tls: {mode: operator}"),
            &Observed::default(),
            &defaults(),
        )
        .expect("valid");
        assert_eq!(valid.tls, Some(Issuer::Operator));
        assert_eq!(
            reason(
                "tls: {mode: operator, issuerRef: {name: ca}}",
                &Observed::default()
            ),
            InvalidReason::InvalidTls
        );
        let plain_running = Observed {
            deployed: Some(deployed()),
            ..Observed::default()
        };
        assert_eq!(
            reason("tls: {mode: operator}", &plain_running),
            InvalidReason::ImmutableField
        );
        let tls_running = Observed {
            deployed: Some(Deployed {
                tls: Some(TlsMode::Operator),
                ..deployed()
            }),
            ..Observed::default()
        };
        assert_eq!(reason("{}", &tls_running), InvalidReason::ImmutableField);
        assert_eq!(
            reason(
                "tls: {mode: certManager, issuerRef: {name: ca}}",
                &tls_running
            ),
            InvalidReason::ImmutableField,
            "the issuer's CA is not the operator's: the nodes would not trust each other"
        );
        assert!(
            validate(
                &boundary("tls: {mode: operator}"),
                &tls_running,
                &defaults()
            )
            .is_ok()
        );
    }

    #[test]
    fn tls_by_cert_manager_needs_an_issuer_and_fills_its_defaults() {
        let valid = validate(
            &boundary("tls: {mode: certManager, issuerRef: {name: ca}}"),
            &Observed::default(),
            &defaults(),
        )
        .expect("valid");
        assert_eq!(
            valid.tls,
            Some(Issuer::CertManager(CertManagerIssuer {
                name: "ca".into(),
                kind: "Issuer".into(),
                group: "cert-manager.io".into(),
            }))
        );
        let cluster = validate(
            &boundary("tls: {mode: certManager, issuerRef: {name: ca, kind: ClusterIssuer}}"),
            &Observed::default(),
            &defaults(),
        )
        .expect("valid");
        assert!(matches!(cluster.tls, Some(Issuer::CertManager(i)) if i.kind == "ClusterIssuer"));
        let external = validate(
            &boundary(
                "tls: {mode: certManager, issuerRef: {name: pca, kind: AWSPCAIssuer, group: awspca.cert-manager.io}}",
            ),
            &Observed::default(),
            &defaults(),
        )
        .expect("an external issuer names its own kinds");
        assert!(
            matches!(external.tls, Some(Issuer::CertManager(i)) if i.group == "awspca.cert-manager.io")
        );
        for bad in [
            "tls: {mode: certManager}",
            "tls: {mode: certManager, issuerRef: {name: ''}}",
            "tls: {mode: certManager, issuerRef: {name: ca, kind: Secret}}",
        ] {
            assert_eq!(
                reason(bad, &Observed::default()),
                InvalidReason::InvalidTls,
                "{bad}"
            );
        }
        let running = Observed {
            deployed: Some(Deployed {
                tls: Some(TlsMode::CertManager),
                ..deployed()
            }),
            ..Observed::default()
        };
        assert!(
            validate(
                &boundary("tls: {mode: certManager, issuerRef: {name: other}}"),
                &running,
                &defaults()
            )
            .is_ok(),
            "another issuer of the same mode is a renewal matter, not a new CA for the pods"
        );
        assert_eq!(
            reason("tls: {mode: operator}", &running),
            InvalidReason::ImmutableField
        );
    }

    #[test]
    fn quantities_parse_like_the_api_server() {
        assert_eq!(quantity_bytes("10Gi"), Some(10 << 30));
        assert_eq!(quantity_bytes("1.5Ki"), Some(1536));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1e3"), Some(1000));
        assert_eq!(quantity_bytes("123"), Some(123));
        assert_eq!(quantity_bytes("0.5"), Some(1));
        for bad in [
            "", "Gi", "10 Gi", "10gi", "1..5", ".5Gi", "5.Gi", "-1Gi", "10Xi",
        ] {
            assert_eq!(quantity_bytes(bad), None, "{bad:?}");
        }
    }
}
