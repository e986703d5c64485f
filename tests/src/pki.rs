//! A throwaway certificate authority for TLS tests: a CA, server certificates for
//! `localhost` and 127.0.0.1, client certificates, written as PEM files the server reads.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

/// A CA and a directory for the files of the certificates it issues.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// The CA certificate's file.
    pub ca_file: PathBuf,
}

/// A certificate chain and its key, as PEM text and as files.
#[derive(Clone)]
pub struct Leaf {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// Private key (PEM).
    pub key_pem: String,
    /// Certificate file.
    pub cert_file: PathBuf,
    /// Key file.
    pub key_file: PathBuf,
    /// Expiry, Unix seconds.
    pub not_after: i64,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let key = KeyPair::generate().expect("CA key");
        let ca = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_file = dir.path().join(format!("{name}-ca.crt"));
        std::fs::write(&ca_file, ca.pem()).expect("write CA");
        Pki {
            dir,
            issuer: Issuer::new(params, key),
            ca_pem: ca.pem(),
            ca_file,
        }
    }

    /// The directory the files are written to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `localhost` and 127.0.0.1, valid for `days`, written to
    /// `<file>.crt` / `<file>.key` (replacing what is there: a renewal).
    pub fn server(&self, file: &str, days: u32) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        self.issue(params, file, days)
    }

    /// A client certificate named `name`, valid for `days`.
    pub fn client(&self, name: &str, days: u32) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, name, days)
    }

    fn issue(&self, mut params: CertificateParams, file: &str, days: u32) -> Leaf {
        // Whole seconds: X.509 times carry no fraction, so the expiry the server reports
        // is comparable with this one.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let not_after = now + u64::from(days) * 86_400;
        params.not_before = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::Duration::from_secs(now.saturating_sub(3600));
        params.not_after =
            rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(not_after);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        let cert_file = self.dir.path().join(format!("{file}.crt"));
        let key_file = self.dir.path().join(format!("{file}.key"));
        // Key first: a reader between the two writes sees the old certificate with a new
        // key, which the server refuses and retries, never a mix it would serve.
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        std::fs::write(&cert_file, cert.pem()).expect("write certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file,
            key_file,
            not_after: i64::try_from(not_after).expect("expiry fits"),
        }
    }
}
