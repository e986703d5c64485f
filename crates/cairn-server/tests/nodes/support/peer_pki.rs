//! Certificates for a cluster whose peers speak mutual TLS: a cluster CA generated in the
//! test, a certificate per member naming the host it advertises, and certificates that
//! must be refused (another CA's, one naming another member).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A CA and the directory its certificates are written to.
pub struct PeerPki {
    dir: PathBuf,
    name: String,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate's file (every node's `--peer-tls-ca`).
    pub ca_file: PathBuf,
    ca_pem: String,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct PeerCert {
    /// Certificate (PEM).
    pub cert_file: PathBuf,
    /// Private key (PEM).
    pub key_file: PathBuf,
}

impl PeerCert {
    /// The `--peer-tls-*` flags of a node with this certificate and `pki`'s CA.
    pub fn serve_args(&self, pki: &PeerPki) -> Vec<String> {
        vec![
            "--peer-tls-cert".to_string(),
            self.cert_file.display().to_string(),
            "--peer-tls-key".to_string(),
            self.key_file.display().to_string(),
            "--peer-tls-ca".to_string(),
            pki.ca_file.display().to_string(),
        ]
    }

    /// TLS that dials a peer port with this certificate, trusting `pki`'s CA and expecting
    /// the server to be named `server_name`.
    pub fn dial(&self, pki: &PeerPki, server_name: &str) -> ClientTlsConfig {
        let read = |path: &Path| std::fs::read(path).expect("read a PEM file");
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&pki.ca_pem))
            .identity(Identity::from_pem(
                read(&self.cert_file),
                read(&self.key_file),
            ))
            .domain_name(server_name)
    }
}

impl PeerPki {
    /// A CA named `name`, its files below `dir`.
    pub fn new(dir: &Path, name: &str) -> PeerPki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} cluster CA"));
        let key = KeyPair::generate().expect("CA key");
        let ca = params.self_signed(&key).expect("CA certificate");
        let dir = dir.join(format!("pki-{name}"));
        std::fs::create_dir_all(&dir).expect("create the PKI dir");
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca.pem()).expect("write the CA");
        PeerPki {
            dir,
            name: name.to_string(),
            issuer: Issuer::new(params, key),
            ca_file,
            ca_pem: ca.pem(),
        }
    }

    /// A certificate named `file` whose SANs are `ips` (a node's advertised host; none
    /// for a tool that is no member).
    pub fn issue(&self, file: &str, ips: &[IpAddr]) -> PeerCert {
        self.issue_until(file, ips, None)
    }

    /// As [`PeerPki::issue`], expiring at `not_after` (Unix seconds) when given: a renewal
    /// written over the files of the same name.
    pub fn issue_until(&self, file: &str, ips: &[IpAddr], not_after: Option<i64>) -> PeerCert {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{file} ({})", self.name));
        params.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
        if let Some(unix) = not_after {
            let seconds = u64::try_from(unix).expect("after 1970");
            params.not_after =
                rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(seconds);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        let cert_file = self.dir.join(format!("{file}.crt"));
        let key_file = self.dir.join(format!("{file}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write the key");
        PeerCert {
            cert_file,
            key_file,
        }
    }
}
