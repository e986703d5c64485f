//! The certificates of a Boundary with `tls: {mode: certManager, issuerRef}`: the operator
//! asks cert-manager for them and hands them to the pods exactly as mode `operator` does.
//!
//! - A `Certificate` per pod, `<pod>-cert`, with the names [`crate::certificates::pod_names`]
//!   gives (the pod's peer DNS name, then the client Service's), for serving and for
//!   dialling peers; cert-manager fills the Secret of the same name.
//! - A `Certificate` for the operator itself, `<name>-operator-cert` (client use only):
//!   what it presents on the pods' peer port, where the cluster API asks for a certificate
//!   of the cluster's CA.
//! - The operator gathers the pods' issued Secrets into `<name>-tls` (`<pod>.crt`,
//!   `<pod>.key`, and `ca.crt`: every CA those Secrets name), which every pod mounts.
//!
//! Why gather instead of mounting cert-manager's Secrets: a StatefulSet's pods share one
//! template, so no pod can mount a Secret of its own, and a template that listed one
//! Secret per pod would restart every pod on each scaling. One wildcard certificate for
//! all pods would let any pod pass for any member, which peer TLS exists to prevent.
//!
//! Renewal is cert-manager's (`renewBefore`); the operator copies a renewed Secret into
//! `<name>-tls` on its next pass (it looks every few minutes, and at once on any change to
//! the Boundary or its StatefulSet), well inside the 30 days it asks for. A pod whose
//! issued Secret is missing or incomplete keeps what `<name>-tls` already holds for it.

use std::collections::BTreeMap;

use kube::api::GroupVersionKind;

use crate::certificates::{CA_CERT_KEY, cert_key, key_key, pod_names};
use crate::validate::{CertManagerIssuer, ValidBoundary};

/// cert-manager's API group and version of `Certificate`.
pub const API_VERSION: &str = "cert-manager.io/v1";
/// The plural of `Certificate` in cert-manager's API.
pub const PLURAL: &str = "certificates";
/// The key of an issued Secret's certificate (chain).
pub const ISSUED_CERT: &str = "tls.crt";
/// The key of an issued Secret's private key.
pub const ISSUED_KEY: &str = "tls.key";
/// How long the certificates asked for last (90 days, as mode `operator` issues them).
pub const DURATION: &str = "2160h";
/// How long before expiry cert-manager renews them (30 days).
pub const RENEW_BEFORE: &str = "720h";
/// The name in the operator's own certificate.
pub const OPERATOR_NAME: &str = "cairn-operator";

/// cert-manager's `Certificate` kind.
pub fn gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate")
}

/// The Certificate (and issued Secret) of pod `ordinal`.
pub fn pod_certificate_name(name: &str, ordinal: i32) -> String {
    format!("{name}-{ordinal}-cert")
}

/// The Certificate (and issued Secret) of the operator's client certificate.
pub fn operator_certificate_name(name: &str) -> String {
    format!("{name}-operator-cert")
}

/// The Certificate of pod `ordinal`: serves both ports and dials the peers.
pub fn pod_certificate(
    valid: &ValidBoundary,
    issuer: &CertManagerIssuer,
    ordinal: i32,
) -> serde_json::Value {
    let names = pod_names(&valid.name, &valid.namespace, ordinal);
    certificate(
        valid,
        issuer,
        pod_certificate_name(&valid.name, ordinal),
        &names,
        &[
            "server auth",
            "client auth",
            "digital signature",
            "key encipherment",
        ],
    )
}

/// The operator's Certificate: client use only.
pub fn operator_certificate(
    valid: &ValidBoundary,
    issuer: &CertManagerIssuer,
) -> serde_json::Value {
    certificate(
        valid,
        issuer,
        operator_certificate_name(&valid.name),
        &[OPERATOR_NAME.to_string()],
        &["client auth", "digital signature", "key encipherment"],
    )
}

fn certificate(
    valid: &ValidBoundary,
    issuer: &CertManagerIssuer,
    name: String,
    dns_names: &[String],
    usages: &[&str],
) -> serde_json::Value {
    let meta = crate::build::metadata(valid, name.clone(), "certificate");
    let labels = meta.labels.clone();
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "Certificate",
        "metadata": meta,
        "spec": {
            "secretName": name,
            "issuerRef": {
                "name": issuer.name,
                "kind": issuer.kind,
                "group": issuer.group,
            },
            "commonName": dns_names[0],
            "dnsNames": dns_names,
            "duration": DURATION,
            "renewBefore": RENEW_BEFORE,
            "usages": usages,
            // PKCS#8: one encoding every TLS stack reads; a fresh key at every renewal.
            "privateKey": {"algorithm": "ECDSA", "size": 256, "encoding": "PKCS8", "rotationPolicy": "Always"},
            // The issued Secrets carry the Boundary's labels, as its other objects do.
            "secretTemplate": {"labels": labels},
        },
    })
}

/// The data of a Secret, by key.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// What [`gather`] made of the issued Secrets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gathered {
    /// The data `<name>-tls` should hold.
    pub data: SecretData,
    /// Pods `0..ready` all have a certificate and key in `data`: the StatefulSet may run
    /// that many.
    pub ready: i32,
    /// The first thing still awaited from cert-manager, for the status; `None` when every
    /// pod and the operator have their certificates.
    pub waiting: Option<String>,
}

/// `<name>-tls` for pods `0..pods` from what cert-manager issued: `issued[ordinal]` is the
/// data of pod `ordinal`'s issued Secret (absent: not there yet), `operator` the operator's,
/// `current` what `<name>-tls` holds now.
pub fn gather(
    name: &str,
    pods: i32,
    issued: &BTreeMap<i32, SecretData>,
    operator: Option<&SecretData>,
    current: &SecretData,
) -> Gathered {
    let complete = |data: &SecretData| {
        [ISSUED_CERT, ISSUED_KEY, CA_CERT_KEY]
            .iter()
            .all(|k| data.get(*k).is_some_and(|v| !v.is_empty()))
    };
    let mut data = SecretData::new();
    let mut waiting = None;
    let mut cas: Vec<String> = Vec::new();
    let mut ready = 0;
    let mut contiguous = true;
    let mut kept = false;
    for ordinal in 0..pods {
        let pod = format!("{name}-{ordinal}");
        let secret = pod_certificate_name(name, ordinal);
        let fresh = issued.get(&ordinal).filter(|d| complete(d));
        let entry = match fresh {
            Some(d) => {
                add_certificates(&mut cas, &d[CA_CERT_KEY]);
                Some((d[ISSUED_CERT].clone(), d[ISSUED_KEY].clone()))
            }
            None => {
                if waiting.is_none() {
                    waiting = Some(awaited(&secret, issued.get(&ordinal)));
                }
                let old = current
                    .get(&cert_key(&pod))
                    .zip(current.get(&key_key(&pod)))
                    .map(|(c, k)| (c.clone(), k.clone()));
                kept |= old.is_some();
                old
            }
        };
        match entry {
            Some((cert, key)) => {
                data.insert(cert_key(&pod), cert);
                data.insert(key_key(&pod), key);
                if contiguous {
                    ready += 1;
                }
            }
            None => contiguous = false,
        }
    }
    match operator.filter(|d| complete(d)) {
        Some(d) => add_certificates(&mut cas, &d[CA_CERT_KEY]),
        None => {
            if waiting.is_none() {
                waiting = Some(awaited(&operator_certificate_name(name), operator));
            }
        }
    }
    if kept && let Some(ca) = current.get(CA_CERT_KEY) {
        // A pod keeps its old certificate: its peers keep trusting the CA that issued it.
        add_certificates(&mut cas, ca);
    }
    let ca = if cas.is_empty() {
        // Nothing issued is readable (yet, or for now): what the pods trust stays.
        current.get(CA_CERT_KEY).cloned()
    } else {
        Some(cas.concat().into_bytes())
    };
    if let Some(ca) = ca {
        data.insert(CA_CERT_KEY.to_string(), ca);
    }
    Gathered {
        data,
        ready,
        waiting,
    }
}

/// Why `secret` is not usable yet, for the status.
fn awaited(secret: &str, data: Option<&SecretData>) -> String {
    match data {
        None => format!("waiting for cert-manager to issue Secret {secret}"),
        Some(d)
            if d.get(CA_CERT_KEY).is_none_or(|v| v.is_empty()) && d.contains_key(ISSUED_CERT) =>
        {
            format!(
                "Secret {secret} has no ca.crt: the issuer must publish its CA (a CA or Vault issuer does; ACME issuers do not), which the nodes trust for their peers"
            )
        }
        Some(_) => {
            format!("waiting for cert-manager to fill Secret {secret} (tls.crt, tls.key, ca.crt)")
        }
    }
}

/// Adds each certificate of the PEM `bundle` to `cas` unless it is there already: one
/// issuer's CA once, and during a change of CA both, so that every pod trusts its peers
/// whichever of the two issued their certificates.
fn add_certificates(cas: &mut Vec<String>, bundle: &[u8]) {
    const END: &str = "-----END CERTIFICATE-----";
    let text = String::from_utf8_lossy(bundle);
    let mut rest = text.as_ref();
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let block = format!("{}\n", &rest[start..start + end + END.len()]);
        if !cas.contains(&block) {
            cas.push(block);
        }
        rest = &rest[start + end + END.len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::Issuer;

    fn issuer() -> CertManagerIssuer {
        CertManagerIssuer {
            name: "shop-ca".into(),
            kind: "ClusterIssuer".into(),
            group: "cert-manager.io".into(),
        }
    }

    fn valid() -> ValidBoundary {
        ValidBoundary {
            tls: Some(Issuer::CertManager(issuer())),
            ..crate::build::tests::valid(3)
        }
    }

    fn pem(label: &str) -> String {
        format!("-----BEGIN CERTIFICATE-----\n{label}\n-----END CERTIFICATE-----\n")
    }

    fn issued(cert: &str, ca: &str) -> SecretData {
        BTreeMap::from([
            (ISSUED_CERT.to_string(), pem(cert).into_bytes()),
            (
                ISSUED_KEY.to_string(),
                format!("key of {cert}").into_bytes(),
            ),
            (CA_CERT_KEY.to_string(), pem(ca).into_bytes()),
        ])
    }

    #[test]
    fn a_pod_certificate_asks_for_the_names_operator_mode_issues() {
        let certificate = pod_certificate(&valid(), &issuer(), 2);
        assert_eq!(certificate["apiVersion"], "cert-manager.io/v1");
        assert_eq!(certificate["kind"], "Certificate");
        assert_eq!(certificate["metadata"]["name"], "orders-2-cert");
        assert_eq!(
            certificate["metadata"]["ownerReferences"][0]["uid"], "uid-1",
            "deleted with the Boundary"
        );
        let spec = &certificate["spec"];
        assert_eq!(spec["secretName"], "orders-2-cert");
        assert_eq!(
            spec["issuerRef"],
            serde_json::json!({"name": "shop-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
        let names: Vec<String> =
            serde_json::from_value(spec["dnsNames"].clone()).expect("dnsNames");
        assert_eq!(names, pod_names("orders", "shop", 2));
        assert_eq!(
            names[0], "orders-2.orders-peers.shop.svc",
            "its peer name first"
        );
        let usages = spec["usages"].as_array().expect("usages");
        assert!(usages.contains(&"server auth".into()) && usages.contains(&"client auth".into()));
        assert_eq!(spec["privateKey"]["encoding"], "PKCS8");
        assert_eq!(
            spec["secretTemplate"]["labels"]["app.kubernetes.io/instance"],
            "orders"
        );

        let operator = operator_certificate(&valid(), &issuer());
        assert_eq!(operator["spec"]["secretName"], "orders-operator-cert");
        assert_eq!(
            operator["spec"]["dnsNames"],
            serde_json::json!(["cairn-operator"])
        );
        assert!(
            !operator["spec"]["usages"]
                .as_array()
                .expect("usages")
                .contains(&"server auth".into()),
            "the operator's certificate serves nothing"
        );
    }

    #[test]
    fn issued_secrets_are_gathered_in_the_layout_the_pods_read() {
        let all = BTreeMap::from([
            (0, issued("pod0", "ca")),
            (1, issued("pod1", "ca")),
            (2, issued("pod2", "ca")),
        ]);
        let operator = issued("operator", "ca");
        let gathered = gather("orders", 3, &all, Some(&operator), &SecretData::new());
        assert_eq!(gathered.ready, 3);
        assert_eq!(gathered.waiting, None);
        assert_eq!(gathered.data["orders-1.crt"], pem("pod1").into_bytes());
        assert_eq!(gathered.data["orders-1.key"], b"key of pod1".to_vec());
        assert_eq!(
            gathered.data["ca.crt"],
            pem("ca").into_bytes(),
            "one CA, once"
        );
        assert_eq!(gathered.data.len(), 7);
        // The same again: nothing to write.
        assert_eq!(
            gather("orders", 3, &all, Some(&operator), &gathered.data),
            gathered
        );
    }

    #[test]
    fn missing_certificates_hold_the_pods_back_and_say_what_is_awaited() {
        let only_first = BTreeMap::from([(0, issued("pod0", "ca"))]);
        let gathered = gather("orders", 3, &only_first, None, &SecretData::new());
        assert_eq!(gathered.ready, 1, "pods run only with their certificates");
        assert_eq!(
            gathered.waiting.as_deref(),
            Some("waiting for cert-manager to issue Secret orders-1-cert")
        );
        // A gap: pod 2 issued, pod 1 not; the StatefulSet still stops at pod 0.
        let gap = BTreeMap::from([(0, issued("pod0", "ca")), (2, issued("pod2", "ca"))]);
        assert_eq!(gather("orders", 3, &gap, None, &SecretData::new()).ready, 1);
        // An issuer without its CA in the Secret is named as the cause.
        let mut no_ca = issued("pod0", "ca");
        no_ca.remove(CA_CERT_KEY);
        let gathered = gather(
            "orders",
            1,
            &BTreeMap::from([(0, no_ca)]),
            None,
            &SecretData::new(),
        );
        assert_eq!(gathered.ready, 0);
        assert!(
            gathered
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("has no ca.crt")),
            "{:?}",
            gathered.waiting
        );
        // Every pod issued, the operator's not yet.
        let all = BTreeMap::from([(0, issued("pod0", "ca"))]);
        assert_eq!(
            gather("orders", 1, &all, None, &SecretData::new())
                .waiting
                .as_deref(),
            Some("waiting for cert-manager to issue Secret orders-operator-cert")
        );
    }

    #[test]
    fn a_pod_whose_issued_secret_went_missing_keeps_its_files() {
        let all = BTreeMap::from([(0, issued("pod0", "ca")), (1, issued("pod1", "ca"))]);
        let operator = issued("operator", "ca");
        let before = gather("orders", 2, &all, Some(&operator), &SecretData::new()).data;
        // cert-manager re-creates pod 1's Secret: for a moment it is gone.
        let without = BTreeMap::from([(0, issued("pod0", "ca"))]);
        let during = gather("orders", 2, &without, Some(&operator), &before);
        assert_eq!(during.ready, 2);
        assert_eq!(during.data, before);
        assert!(during.waiting.is_some());
    }

    #[test]
    fn during_a_change_of_ca_the_pods_trust_both() {
        let all = BTreeMap::from([(0, issued("pod0", "new-ca")), (1, issued("pod1", "old-ca"))]);
        let operator = issued("operator", "old-ca");
        let gathered = gather("orders", 2, &all, Some(&operator), &SecretData::new());
        assert_eq!(
            gathered.data["ca.crt"],
            format!("{}{}", pem("new-ca"), pem("old-ca")).into_bytes()
        );
        // Once every certificate comes from the new CA, the old one goes.
        let renewed =
            BTreeMap::from([(0, issued("pod0", "new-ca")), (1, issued("pod1", "new-ca"))]);
        let operator = issued("operator", "new-ca");
        let after = gather("orders", 2, &renewed, Some(&operator), &gathered.data);
        assert_eq!(after.data["ca.crt"], pem("new-ca").into_bytes());
    }
}
