//! TLS on the node's ports: certificate files loaded at start-up and reloaded when they
//! change, without dropping open connections.
//!
//! cert-manager and the kubelet rewrite a mounted Secret in place (an atomic symlink swap),
//! and the most common TLS outage is a node that loaded its certificate once and serves it
//! past its expiry although the renewed one sits on disk. So one owner task re-reads the
//! files every `reload_interval` and publishes what it loaded on a `watch` channel; each
//! port builds a new rustls `ServerConfig` for its next handshake when the material
//! changed. Open connections keep the session they negotiated.
//!
//! A renewal written file by file (certificate first, key second) is seen half-done at
//! some poll: a certificate and key that do not belong together are never published, the
//! next poll finds the pair complete.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

/// Named defaults of the TLS settings.
pub mod defaults {
    /// Seconds between checks of the certificate files for a renewal.
    pub const RELOAD_SECS: u64 = 10;
    /// Seconds a client has to complete its TLS handshake.
    pub const HANDSHAKE_TIMEOUT_SECS: u64 = 10;
}

/// ALPN of the gRPC ports: tonic's clients refuse a TLS connection that did not agree on h2.
pub const ALPN_GRPC: &[&[u8]] = &[b"h2"];
/// ALPN of the HTTP port (/metrics, probes): HTTP/1.1 only.
pub const ALPN_HTTP: &[&[u8]] = &[b"http/1.1"];

/// Which of a node's two certificate sets a [`TlsFiles`] is: it names the flags in errors
/// and the certificates in the expiry metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRole {
    /// The client port's (and HTTP port's): `--tls-*`.
    Client,
    /// The peer port's, which is also the identity the node dials peers with:
    /// `--peer-tls-*`.
    Peer,
}

impl TlsRole {
    fn cert_flag(self) -> &'static str {
        match self {
            TlsRole::Client => "--tls-cert",
            TlsRole::Peer => "--peer-tls-cert",
        }
    }

    fn key_flag(self) -> &'static str {
        match self {
            TlsRole::Client => "--tls-key",
            TlsRole::Peer => "--peer-tls-key",
        }
    }

    fn ca_flag(self) -> &'static str {
        match self {
            TlsRole::Client => "--tls-client-ca",
            TlsRole::Peer => "--peer-tls-ca",
        }
    }

    /// `certificate` label values of the expiry gauge: the leaf, the CA.
    fn expiry_labels(self) -> (&'static str, &'static str) {
        match self {
            TlsRole::Client => ("serving", "client_ca"),
            TlsRole::Peer => ("peer", "peer_ca"),
        }
    }
}

/// Where a node's certificate material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Which set this is.
    pub role: TlsRole,
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates a client certificate must chain to; `None`: no client
    /// certificates asked for.
    pub client_ca: Option<PathBuf>,
}

/// TLS of the node's client-facing ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate files.
    pub files: TlsFiles,
    /// Whether the HTTP port serves TLS too (never asking for a client certificate:
    /// kubelet probes cannot present one).
    pub http: bool,
    /// Interval between checks of the files for a renewal.
    pub reload_interval: Duration,
    /// Time a client has to complete its handshake.
    pub handshake_timeout: Duration,
}

/// Certificate material that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("failed to read {what} {}: {source}", path.display())]
    Read {
        /// Which flag named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM, or what it holds is not accepted.
    #[error("{what} {}: {detail}", path.display())]
    Invalid {
        /// Which flag named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("failed to build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

impl TlsError {
    fn invalid(what: &'static str, path: &Path, detail: impl Into<String>) -> TlsError {
        TlsError::Invalid {
            what,
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

/// The files' bytes as last read: a reload happens when they differ.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileBytes {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// One loaded certificate, key and client CA, ready for handshakes.
pub struct Material {
    role: TlsRole,
    bytes: FileBytes,
    provider: Arc<CryptoProvider>,
    certified: Arc<CertifiedKey>,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// Unix time the serving certificate (the chain's leaf) expires.
    pub serving_not_after: i64,
    /// Unix time the first of the client CA certificates expires.
    pub client_ca_not_after: Option<i64>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("serving_not_after", &self.serving_not_after)
            .field("client_ca_not_after", &self.client_ca_not_after)
            .finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_files(files: &TlsFiles) -> Result<FileBytes, TlsError> {
    Ok(FileBytes {
        cert: read(files.role.cert_flag(), &files.cert)?,
        key: read(files.role.key_flag(), &files.key)?,
        client_ca: match &files.client_ca {
            Some(path) => Some(read(files.role.ca_flag(), path)?),
            None => None,
        },
    })
}

fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::invalid(what, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::invalid(what, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn not_after(what: &'static str, path: &Path, cert: &[u8]) -> Result<i64, TlsError> {
    der::not_after(cert).ok_or_else(|| {
        TlsError::invalid(
            what,
            path,
            "holds a certificate that is not valid X.509 DER",
        )
    })
}

impl Material {
    /// Reads and checks the files: a parseable chain, a key that belongs to its leaf, a
    /// client CA that rustls accepts.
    pub fn load(files: &TlsFiles) -> Result<Material, TlsError> {
        Material::parse(files, read_files(files)?)
    }

    fn parse(files: &TlsFiles, bytes: FileBytes) -> Result<Material, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert_flag, key_flag, ca_flag) = (
            files.role.cert_flag(),
            files.role.key_flag(),
            files.role.ca_flag(),
        );
        let chain = certificates(cert_flag, &files.cert, &bytes.cert)?;
        let serving_not_after = not_after(cert_flag, &files.cert, &chain[0])?;
        let key = PrivateKeyDer::from_pem_slice(&bytes.key).map_err(|e| {
            TlsError::invalid(
                key_flag,
                &files.key,
                format!("holds no PEM private key: {e}"),
            )
        })?;
        let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
            let cert = files.cert.display();
            let detail = format!("does not go with the certificate in {cert}: {e}");
            TlsError::invalid(key_flag, &files.key, detail)
        })?;
        let (client_verifier, client_ca_not_after) = match (&files.client_ca, &bytes.client_ca) {
            (Some(path), Some(pem)) => {
                let cas = certificates(ca_flag, path, pem)?;
                let mut roots = RootCertStore::empty();
                let mut first_expiry = i64::MAX;
                for ca in cas {
                    first_expiry = first_expiry.min(not_after(ca_flag, path, &ca)?);
                    roots.add(ca).map_err(|e| {
                        let detail =
                            format!("holds a certificate that cannot be a trust anchor: {e}");
                        TlsError::invalid(ca_flag, path, detail)
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| TlsError::invalid(ca_flag, path, e.to_string()))?;
                (Some(verifier), Some(first_expiry))
            }
            _ => (None, None),
        };
        Ok(Material {
            role: files.role,
            bytes,
            provider,
            certified: Arc::new(certified),
            client_verifier,
            serving_not_after,
            client_ca_not_after,
        })
    }

    /// A rustls server configuration for one port. `client_auth`: ask for (and require) a
    /// client certificate when a client CA is configured.
    pub fn server_config(
        &self,
        alpn: &[&[u8]],
        client_auth: bool,
    ) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match (&self.client_verifier, client_auth) {
            (Some(verifier), true) => builder.with_client_cert_verifier(verifier.clone()),
            _ => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(self.certified.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

impl Material {
    /// The TLS a node dials its peers with: their certificates must chain to the peer CA
    /// and name the host dialled; ours is the client certificate. `None` without a CA.
    pub fn peer_client_tls(&self) -> Option<tonic::transport::ClientTlsConfig> {
        let ca = self.bytes.client_ca.as_ref()?;
        Some(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .identity(tonic::transport::Identity::from_pem(
                    &self.bytes.cert,
                    &self.bytes.key,
                )),
        )
    }
}

/// Whether the certificate `leaf` (DER) is valid for `host`, a DNS name or an IP address,
/// as a server certificate would be checked for the host a client dials. The chain was
/// verified in the handshake; this is the name check that ties it to one member.
pub fn certificate_names(leaf: &CertificateDer<'_>, host: &str) -> Result<(), String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls_pki_types::ServerName::try_from(host)
        .map_err(|e| format!("{host:?} is neither a DNS name nor an IP address: {e}"))?;
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| format!("the certificate cannot be parsed: {e}"))?;
    cert.verify_is_valid_for_subject_name(&name)
        .map_err(|e| format!("the certificate is not valid for {host}: {e}"))
}

/// Expiry gauges and reload outcomes, exported by the reloader.
#[derive(Clone)]
pub struct TlsMetrics {
    /// `cairn_tls_certificate_expiry_timestamp_seconds{certificate}`.
    pub expiry: prometheus::IntGaugeVec,
    /// `cairn_tls_reloads_total{result}`.
    pub reloads: prometheus::IntCounterVec,
}

impl TlsMetrics {
    fn publish(&self, material: &Material) {
        let (leaf, ca_label) = material.role.expiry_labels();
        self.expiry
            .with_label_values(&[leaf])
            .set(material.serving_not_after);
        if let Some(ca) = material.client_ca_not_after {
            self.expiry.with_label_values(&[ca_label]).set(ca);
        }
    }
}

/// Starts the owner task of `files`: publishes `initial`, then whatever it reloads, until
/// every receiver (every port's [`TlsPort`]) is gone.
pub fn spawn_reloader(
    files: TlsFiles,
    initial: Material,
    interval: Duration,
    metrics: TlsMetrics,
) -> watch::Receiver<Arc<Material>> {
    metrics.publish(&initial);
    let (tx, rx) = watch::channel(Arc::new(initial));
    tokio::spawn(async move {
        // The bytes of the last failed attempt: the same broken files are reported once.
        let mut failed: Option<FileBytes> = None;
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let read = {
                let files = files.clone();
                tokio::task::spawn_blocking(move || read_files(&files)).await
            };
            let bytes = match read {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(e)) => {
                    // A Secret volume swap can briefly show a missing file: try again next time.
                    tracing::debug!(
                        "failed to re-read the TLS files, keeping the loaded ones: {e}"
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!("the TLS file reader failed, keeping the loaded files: {e}");
                    continue;
                }
            };
            if bytes == tx.borrow().bytes || failed.as_ref() == Some(&bytes) {
                continue;
            }
            match Material::parse(&files, bytes.clone()) {
                Ok(material) => {
                    failed = None;
                    metrics.reloads.with_label_values(&["loaded"]).inc();
                    metrics.publish(&material);
                    tracing::info!(
                        cert = %files.cert.display(),
                        expires_unix = material.serving_not_after,
                        "loaded a new TLS certificate; new connections get it"
                    );
                    tx.send_replace(Arc::new(material));
                }
                Err(e) => {
                    metrics.reloads.with_label_values(&["failed"]).inc();
                    tracing::warn!(
                        "the TLS files changed but cannot be used, keeping the loaded ones: {e}"
                    );
                    failed = Some(bytes);
                }
            }
        }
    });
    rx
}

/// The TLS side of one port: the current configuration, rebuilt when the material changes.
pub struct TlsPort {
    material: watch::Receiver<Arc<Material>>,
    alpn: &'static [&'static [u8]],
    client_auth: bool,
    current: Arc<ServerConfig>,
    /// Time a client has to complete its handshake.
    pub handshake_timeout: Duration,
}

impl TlsPort {
    /// A port serving `material` with `alpn`, asking for client certificates when
    /// `client_auth` and a client CA is configured.
    pub fn new(
        mut material: watch::Receiver<Arc<Material>>,
        alpn: &'static [&'static [u8]],
        client_auth: bool,
        handshake_timeout: Duration,
    ) -> Result<TlsPort, TlsError> {
        let current = Arc::new(
            material
                .borrow_and_update()
                .server_config(alpn, client_auth)?,
        );
        Ok(TlsPort {
            material,
            alpn,
            client_auth,
            current,
            handshake_timeout,
        })
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&mut self) -> tokio_rustls::TlsAcceptor {
        if self.material.has_changed().unwrap_or(false) {
            let material = self.material.borrow_and_update().clone();
            match material.server_config(self.alpn, self.client_auth) {
                Ok(config) => self.current = Arc::new(config),
                Err(e) => tracing::warn!(
                    "failed to build a TLS configuration from the reloaded files, keeping the previous one: {e}"
                ),
            }
        }
        tokio_rustls::TlsAcceptor::from(self.current.clone())
    }
}

/// Just enough DER to find a certificate's expiry, without an X.509 library.
mod der {
    /// One tag-length-value: (tag, content, rest).
    fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let octets = usize::from(first & 0x7f);
            if octets == 0 || octets > 4 || rest.len() < octets {
                return None;
            }
            let len = rest[..octets]
                .iter()
                .fold(0usize, |len, &b| (len << 8) | usize::from(b));
            (len, &rest[octets..])
        };
        if rest.len() < len {
            return None;
        }
        Some((tag, &rest[..len], &rest[len..]))
    }

    const SEQUENCE: u8 = 0x30;
    const VERSION: u8 = 0xa0;
    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;

    /// The `notAfter` of a DER certificate, as Unix seconds.
    pub fn not_after(cert: &[u8]) -> Option<i64> {
        let (SEQUENCE, certificate, _) = tlv(cert)? else {
            return None;
        };
        let (SEQUENCE, tbs, _) = tlv(certificate)? else {
            return None;
        };
        // version [0] (optional), serialNumber, signature, issuer, then validity.
        let (tag, _, mut rest) = tlv(tbs)?;
        if tag == VERSION {
            (_, _, rest) = tlv(rest)?;
        }
        let (_, _, rest) = tlv(rest)?;
        let (_, _, rest) = tlv(rest)?;
        let (SEQUENCE, validity, _) = tlv(rest)? else {
            return None;
        };
        let (_, _, after) = tlv(validity)?;
        let (tag, time, _) = tlv(after)?;
        parse_time(tag, time)
    }

    fn digits(text: &[u8]) -> Option<i64> {
        text.iter().try_fold(0i64, |n, &b| {
            b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
        })
    }

    /// UTCTime `YYMMDDHHMMSSZ` (RFC 5280: YY ≥ 50 is 19YY) or GeneralizedTime
    /// `YYYYMMDDHHMMSSZ`.
    fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
        let (year, rest) = match tag {
            UTC_TIME if text.len() == 13 => {
                let yy = digits(&text[..2])?;
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
            }
            GENERALIZED_TIME if text.len() == 15 => (digits(&text[..4])?, &text[4..]),
            _ => return None,
        };
        if rest[10] != b'Z' {
            return None;
        }
        let month = digits(&rest[0..2])?;
        let day = digits(&rest[2..4])?;
        let hour = digits(&rest[4..6])?;
        let minute = digits(&rest[6..8])?;
        let second = digits(&rest[8..10])?;
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
            return None;
        }
        Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn civil_days_match_known_dates() {
            assert_eq!(days_from_civil(1970, 1, 1), 0);
            assert_eq!(days_from_civil(2000, 3, 1), 11_017);
            assert_eq!(days_from_civil(2026, 12, 5), 20_792);
        }

        #[test]
        fn times_of_both_encodings_parse() {
            assert_eq!(parse_time(UTC_TIME, b"700101000000Z"), Some(0));
            assert_eq!(parse_time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
            assert_eq!(
                parse_time(GENERALIZED_TIME, b"20500101000000Z"),
                Some(2_524_608_000)
            );
            assert_eq!(parse_time(UTC_TIME, b"700101000000+"), None);
            assert_eq!(parse_time(UTC_TIME, b"7001010000Z"), None);
        }

        #[test]
        fn garbage_has_no_expiry() {
            assert_eq!(not_after(b""), None);
            assert_eq!(not_after(&[0x30, 0x82, 0xff]), None);
            assert_eq!(not_after(&[0x30, 0x03, 0x02, 0x01, 0x00]), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: tempfile::TempDir,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        ca_pem: String,
    }

    impl Pki {
        fn new() -> Pki {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().expect("key");
            let ca = params.self_signed(&key).expect("CA");
            Pki {
                dir: tempfile::tempdir().expect("temp dir"),
                issuer: rcgen::Issuer::new(params, key),
                ca_pem: ca.pem(),
            }
        }

        /// Writes a leaf for `localhost` expiring at `not_after` (Unix seconds).
        fn leaf(&self, name: &str, not_after: i64) -> (PathBuf, PathBuf) {
            let mut params =
                rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
            params.not_after = rcgen::date_time_ymd(1970, 1, 1) + time_offset(not_after);
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &self.issuer).expect("leaf");
            let cert_path = self.dir.path().join(format!("{name}.crt"));
            let key_path = self.dir.path().join(format!("{name}.key"));
            std::fs::write(&cert_path, cert.pem()).expect("write cert");
            std::fs::write(&key_path, key.serialize_pem()).expect("write key");
            (cert_path, key_path)
        }
    }

    fn time_offset(seconds: i64) -> std::time::Duration {
        std::time::Duration::from_secs(u64::try_from(seconds).expect("after 1970"))
    }

    fn files(cert: PathBuf, key: PathBuf) -> TlsFiles {
        TlsFiles {
            role: TlsRole::Client,
            cert,
            key,
            client_ca: None,
        }
    }

    #[test]
    fn loads_a_chain_and_reads_its_expiry() {
        let pki = Pki::new();
        let (cert, key) = pki.leaf("node", 2_000_000_000);
        let material = Material::load(&files(cert, key)).expect("loads");
        assert_eq!(material.serving_not_after, 2_000_000_000);
        assert!(material.server_config(ALPN_GRPC, true).is_ok());
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let pki = Pki::new();
        let (cert, _) = pki.leaf("a", 2_000_000_000);
        let (_, other_key) = pki.leaf("b", 2_000_000_000);
        let error = Material::load(&files(cert, other_key)).expect_err("mismatched key");
        assert!(
            error
                .to_string()
                .contains("does not go with the certificate"),
            "{error}"
        );
    }

    #[test]
    fn files_without_pem_are_refused_with_the_flag_named() {
        let pki = Pki::new();
        let (cert, key) = pki.leaf("node", 2_000_000_000);
        std::fs::write(&cert, "not a certificate").expect("write");
        let error = Material::load(&files(cert.clone(), key.clone())).expect_err("no PEM");
        assert!(error.to_string().starts_with("--tls-cert"), "{error}");
        std::fs::remove_file(&key).expect("remove");
        let (cert, _) = pki.leaf("node2", 2_000_000_000);
        let error = Material::load(&files(cert, key)).expect_err("missing key");
        assert!(
            error.to_string().contains("failed to read --tls-key"),
            "{error}"
        );
    }

    #[test]
    fn a_client_ca_is_loaded_with_its_expiry() {
        let pki = Pki::new();
        let (cert, key) = pki.leaf("node", 2_000_000_000);
        let ca = pki.dir.path().join("ca.crt");
        std::fs::write(&ca, &pki.ca_pem).expect("write CA");
        let material = Material::load(&TlsFiles {
            client_ca: Some(ca),
            ..files(cert, key)
        })
        .expect("loads");
        assert!(material.client_ca_not_after.is_some());
        assert!(material.client_verifier.is_some());
        assert!(material.peer_client_tls().is_some());
    }

    #[test]
    fn peer_files_are_named_by_their_own_flags() {
        let pki = Pki::new();
        let (cert, _) = pki.leaf("node", 2_000_000_000);
        let (_, other_key) = pki.leaf("other", 2_000_000_000);
        let err = Material::load(&TlsFiles {
            role: TlsRole::Peer,
            ..files(cert, other_key)
        })
        .expect_err("a key of another certificate");
        assert!(err.to_string().starts_with("--peer-tls-key "), "{err}");
    }

    fn leaf_der(names: &[&str]) -> CertificateDer<'static> {
        let pki = Pki::new();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let key = rcgen::KeyPair::generate().expect("key");
        params
            .signed_by(&key, &pki.issuer)
            .expect("leaf")
            .der()
            .clone()
    }

    #[test]
    fn a_certificate_names_the_hosts_of_its_sans_only() {
        let leaf = leaf_der(&["cairn-0.cairn-peers.db.svc", "127.0.0.31"]);
        assert_eq!(
            certificate_names(&leaf, "cairn-0.cairn-peers.db.svc"),
            Ok(())
        );
        assert_eq!(certificate_names(&leaf, "127.0.0.31"), Ok(()));
        for other in ["cairn-1.cairn-peers.db.svc", "127.0.0.32", "db.svc"] {
            let refused = certificate_names(&leaf, other).expect_err(other);
            assert!(refused.contains("not valid for"), "{refused}");
        }
        let v6 = leaf_der(&["::1"]);
        assert_eq!(certificate_names(&v6, "[::1]"), Ok(()));
        assert!(certificate_names(&leaf, "not a name!").is_err());
    }
}
