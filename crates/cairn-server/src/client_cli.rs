//! What every `cairn` command that calls a node's client port shares: where the node is,
//! how to log in, how to speak TLS to it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Default client endpoint (a local node's client port).
pub const DEFAULT_CLIENT_ENDPOINT: &str = "127.0.0.1:5005";
/// Default user of administrative commands.
pub const DEFAULT_USER: &str = "admin";

/// Flags of a command that calls a node's client port.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientPortArgs {
    /// Client address (host:port) of any node; a follower passes changes to the leader.
    #[arg(
        long,
        env = "CAIRN_CLIENT_ENDPOINT",
        default_value = DEFAULT_CLIENT_ENDPOINT,
        global = true
    )]
    pub endpoint: String,

    /// User to log in as (administrative commands need the ADMIN role).
    #[arg(long, env = "CAIRN_USER", default_value = DEFAULT_USER, global = true)]
    pub user: String,

    /// The user's password.
    #[arg(long, env = "CAIRN_PASSWORD", hide_env_values = true, global = true)]
    pub password: Option<String>,

    /// File holding the user's password (its first line), e.g. a mounted Secret's key.
    #[arg(
        long,
        env = "CAIRN_PASSWORD_FILE",
        global = true,
        conflicts_with = "password"
    )]
    pub password_file: Option<PathBuf>,

    /// PEM certificate of the CA that signed the node's client-port certificate: speak TLS
    /// (the node's --tls-cert).
    #[arg(long, env = "CAIRN_CLIENT_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,

    /// PEM certificate to present, for a node that requires client certificates (its
    /// --tls-client-ca); needs --tls-key.
    #[arg(long, env = "CAIRN_CLIENT_TLS_CERT", global = true, requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(
        long,
        env = "CAIRN_CLIENT_TLS_KEY",
        global = true,
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Name the node's certificate must carry, when it is not the --endpoint host.
    #[arg(
        long,
        env = "CAIRN_TLS_SERVER_NAME",
        global = true,
        requires = "tls_ca"
    )]
    pub tls_server_name: Option<String>,

    /// Print one JSON object instead of text.
    #[arg(long, env = "CAIRN_OUTPUT_JSON", global = true)]
    pub json: bool,
}

/// Adds the Basic credentials to every call.
#[derive(Clone)]
pub struct Credentials(MetadataValue<tonic::metadata::Ascii>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// The contents of the file `flag` names, or an error saying which flag.
fn read(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("failed to read {flag} {}", path.display()))
}

/// TLS to a node (client or peer port): the CA of `--tls-ca`, the certificate and key of
/// `--tls-cert`/`--tls-key` to present, and the name of `--tls-server-name` to expect.
pub(crate) fn dial_tls(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    server_name: Option<&str>,
) -> anyhow::Result<ClientTlsConfig> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            read("--tls-cert", cert)?,
            read("--tls-key", key)?,
        ));
    }
    if let Some(name) = server_name {
        tls = tls.domain_name(name);
    }
    Ok(tls)
}

/// Whether a plaintext call failed on a TLS port: it fails in HTTP/2 framing, which says
/// nothing of TLS.
pub(crate) fn met_a_tls_port(status: &tonic::Status) -> bool {
    status.message().contains("h2 protocol error")
}

impl ClientPortArgs {
    fn password(&self) -> anyhow::Result<String> {
        match (&self.password, &self.password_file) {
            (Some(password), _) => Ok(password.clone()),
            (None, Some(path)) => {
                let text = String::from_utf8(read("--password-file", path)?)
                    .with_context(|| format!("--password-file {} is not UTF-8", path.display()))?;
                Ok(text.lines().next().unwrap_or_default().to_string())
            }
            (None, None) => anyhow::bail!(
                "no password for user {:?}: pass --password or --password-file (or set CAIRN_PASSWORD)",
                self.user
            ),
        }
    }

    fn tls(&self) -> anyhow::Result<Option<ClientTlsConfig>> {
        let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        self.tls_ca
            .as_deref()
            .map(|ca| dial_tls(ca, identity, self.tls_server_name.as_deref()))
            .transpose()
    }

    /// A connection to the endpoint and the credentials to send on it.
    pub async fn connect(&self) -> anyhow::Result<(Channel, Credentials)> {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            self.user,
            self.password()?
        ));
        let header: MetadataValue<_> = format!("Basic {basic}")
            .parse()
            .context("the user name and password must be printable ASCII in a header")?;
        let tls = self.tls()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.endpoint))
            .with_context(|| format!("invalid --endpoint {:?}: expected host:port", self.endpoint))?
            .connect_timeout(std::time::Duration::from_secs(10));
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).context("failed to set up TLS")?;
        }
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("failed to connect to {}", self.endpoint))?;
        Ok((channel, Credentials(header)))
    }

    /// A failed call, said for a person: the endpoint, the code, the server's message, and
    /// a hint when a plaintext call met a TLS port.
    pub fn failed(&self, status: &tonic::Status) -> anyhow::Error {
        let hint = if self.tls_ca.is_none() && met_a_tls_port(status) {
            " (if its client port speaks TLS, pass --tls-ca)"
        } else {
            ""
        };
        anyhow::anyhow!(
            "{}: {:?}: {}{hint}",
            self.endpoint,
            status.code(),
            status.message()
        )
    }
}
