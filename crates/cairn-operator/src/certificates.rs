//! The certificates of a Boundary with `tls: {mode: operator}`: a CA of its own and one
//! certificate per pod, kept in three Secrets.
//!
//! - `<name>-ca-key`: the CA's certificate and key. Only the operator reads it; no pod
//!   mounts it.
//! - `<name>-ca`: the CA's certificate alone, what clients trust.
//! - `<name>-tls`: `ca.crt` and, per pod, `<pod>.crt` and `<pod>.key`, mounted into every
//!   pod; each node picks its own files by its pod name. A pod's certificate names its
//!   stable peer DNS name (what its peers dial and what they check a Raft message against)
//!   and the client Service's names (what clients dial), and serves both ports.
//!
//! One Secret for every pod is what a StatefulSet can mount (its pods share one template),
//! as Strimzi did for its brokers: a member that is taken over can read the others' keys.
//! What the per-pod names still give is that no pod of another Boundary, no pod without the
//! Secret and no process elsewhere can pass for a member, and that a misrouted connection
//! fails instead of talking to the wrong node.
//!
//! Renewal: a certificate is reissued once less than [`RENEW_WITHIN`] of its
//! [`POD_VALIDITY`] remains (or when it is missing, unreadable or from another CA); the
//! kubelet rewrites the mounted files and the nodes reload them without a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a pod's certificate is valid.
pub const POD_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// A pod's certificate is reissued once less than this remains.
pub const RENEW_WITHIN: Duration = Duration::from_secs(30 * 24 * 3600);
/// The CA certificate's key in `<name>-ca` and `<name>-tls`.
pub const CA_CERT_KEY: &str = "ca.crt";
/// The CA's certificate and key in `<name>-ca-key`.
pub const CA_KEY_CERT: &str = "tls.crt";
/// The CA's private key in `<name>-ca-key`.
pub const CA_KEY_KEY: &str = "tls.key";
/// Where `<name>-tls` is mounted in the pods.
pub const TLS_MOUNT: &str = "/etc/cairn/tls";

/// What cannot be issued.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// rcgen refused the parameters or the stored CA.
    #[error("failed to {what}: {source}")]
    Issue {
        /// What was being done.
        what: &'static str,
        /// Why not.
        source: rcgen::Error,
    },
}

fn failed(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertificateError {
    move |source| CertificateError::Issue { what, source }
}

/// The Secret with the CA's key.
pub fn ca_key_secret_name(name: &str) -> String {
    format!("{name}-ca-key")
}

/// The Secret with the CA's certificate, for clients.
pub fn ca_secret_name(name: &str) -> String {
    format!("{name}-ca")
}

/// The Secret the pods mount.
pub fn tls_secret_name(name: &str) -> String {
    format!("{name}-tls")
}

/// The certificate file of pod `pod` in `<name>-tls`.
pub fn cert_key(pod: &str) -> String {
    format!("{pod}.crt")
}

/// The key file of pod `pod` in `<name>-tls`.
pub fn key_key(pod: &str) -> String {
    format!("{pod}.key")
}

/// The names pod `ordinal` of Boundary `name` answers to: its peer DNS name (first: the
/// host of its advertised address) and the client Service's.
pub fn pod_names(name: &str, namespace: &str, ordinal: i32) -> Vec<String> {
    let peers = crate::build::peer_service_name(name);
    vec![
        format!("{name}-{ordinal}.{peers}.{namespace}.svc"),
        format!("{name}-{ordinal}.{peers}.{namespace}.svc.cluster.local"),
        name.to_string(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// Valid from an hour before `now` (clocks differ) until `now + lasting`.
fn valid_for(params: &mut CertificateParams, now: i64, lasting: Duration) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs((now - 3600).max(0) as u64);
    params.not_after = epoch + Duration::from_secs(now.max(0) as u64) + lasting;
}

/// A Boundary's CA.
pub struct Authority {
    /// Its certificate (PEM).
    pub cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    /// A new CA for Boundary `name` in `namespace`, valid from `now` (Unix seconds).
    pub fn generate(name: &str, namespace: &str, now: i64) -> Result<Authority, CertificateError> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(failed("make CA parameters"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("cairn {namespace}/{name} CA"));
        valid_for(&mut params, now, CA_VALIDITY);
        let key = KeyPair::generate().map_err(failed("generate a CA key"))?;
        let cert = params.self_signed(&key).map_err(failed("sign the CA"))?;
        let key_pem = key.serialize_pem();
        Ok(Authority {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA stored as `cert_pem` and `key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Authority, CertificateError> {
        let key = KeyPair::from_pem(key_pem).map_err(failed("read the CA key"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(failed("read the CA certificate"))?;
        Ok(Authority {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// The CA's key (PEM), for its Secret.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate and key (PEM) for `names` (the first is also the common name), valid
    /// from `now` for [`POD_VALIDITY`], usable as server and as client.
    pub fn issue(&self, names: &[String], now: i64) -> Result<(String, String), CertificateError> {
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(failed("make certificate parameters"))?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(DnType::CommonName, first.clone());
        }
        valid_for(&mut params, now, POD_VALIDITY);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(failed("generate a key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(failed("sign a certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// When the first certificate in `pem` expires (Unix seconds); `None` if it is not one.
pub fn not_after(pem: &[u8]) -> Option<i64> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The ordinals among `0..pods` whose certificate in `tls` (the data of `<name>-tls`)
/// must be issued: missing, unreadable, expiring within [`RENEW_WITHIN`] of `now`, or
/// every one when the Secret's CA is not `ca_pem` (the CA was replaced).
pub fn due(
    name: &str,
    pods: i32,
    ca_pem: &str,
    tls: &BTreeMap<String, Vec<u8>>,
    now: i64,
) -> Vec<i32> {
    let same_ca = tls
        .get(CA_CERT_KEY)
        .is_some_and(|ca| ca == ca_pem.as_bytes());
    (0..pods)
        .filter(|ordinal| {
            let pod = format!("{name}-{ordinal}");
            let expires = tls.get(&cert_key(&pod)).and_then(|pem| not_after(pem));
            let has_key = tls.contains_key(&key_key(&pod));
            !same_ca
                || !has_key
                || expires.is_none_or(|at| at - now < RENEW_WITHIN.as_secs() as i64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn secret_with(authority: &Authority, pods: &[(i32, i64)]) -> BTreeMap<String, Vec<u8>> {
        let mut data = BTreeMap::from([(
            CA_CERT_KEY.to_string(),
            authority.cert_pem.clone().into_bytes(),
        )]);
        for &(ordinal, issued) in pods {
            let (cert, key) = authority
                .issue(&pod_names("orders", "shop", ordinal), issued)
                .expect("issue");
            data.insert(cert_key(&format!("orders-{ordinal}")), cert.into_bytes());
            data.insert(key_key(&format!("orders-{ordinal}")), key.into_bytes());
        }
        data
    }

    #[test]
    fn a_pod_certificate_names_its_peer_host_first_and_lasts_its_validity() {
        let ca = Authority::generate("orders", "shop", NOW).expect("CA");
        let names = pod_names("orders", "shop", 2);
        assert_eq!(names[0], "orders-2.orders-peers.shop.svc");
        assert!(names.contains(&"orders.shop.svc".to_string()));
        let (cert, _) = ca.issue(&names, NOW).expect("issue");
        assert_eq!(
            not_after(cert.as_bytes()),
            Some(NOW + POD_VALIDITY.as_secs() as i64)
        );
        assert_eq!(
            not_after(ca.cert_pem.as_bytes()),
            Some(NOW + CA_VALIDITY.as_secs() as i64)
        );
        assert_eq!(not_after(b"not a certificate"), None);
    }

    #[test]
    fn a_stored_ca_issues_again() {
        let ca = Authority::generate("orders", "shop", NOW).expect("CA");
        let again = Authority::from_pem(&ca.cert_pem, ca.key_pem()).expect("reloaded");
        again
            .issue(&pod_names("orders", "shop", 0), NOW)
            .expect("issue");
        assert!(Authority::from_pem(&ca.cert_pem, "garbage").is_err());
    }

    #[test]
    fn certificates_are_due_when_missing_expiring_or_from_another_ca() {
        let ca = Authority::generate("orders", "shop", NOW).expect("CA");
        let fresh = secret_with(&ca, &[(0, NOW), (1, NOW), (2, NOW)]);
        assert!(due("orders", 3, &ca.cert_pem, &fresh, NOW).is_empty());
        // Growing to five: the two new pods.
        assert_eq!(due("orders", 5, &ca.cert_pem, &fresh, NOW), [3, 4]);
        // Sixty-one days on, less than thirty remain of ninety.
        let later = NOW + 61 * 24 * 3600;
        assert_eq!(due("orders", 3, &ca.cert_pem, &fresh, later), [0, 1, 2]);
        assert!(due("orders", 3, &ca.cert_pem, &fresh, NOW + 59 * 24 * 3600).is_empty());
        // A key gone, or another CA.
        let mut keyless = fresh.clone();
        keyless.remove(&key_key("orders-1"));
        assert_eq!(due("orders", 3, &ca.cert_pem, &keyless, NOW), [1]);
        let other = Authority::generate("orders", "shop", NOW).expect("CA");
        assert_eq!(due("orders", 3, &other.cert_pem, &fresh, NOW), [0, 1, 2]);
    }
}
