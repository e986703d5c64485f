//! How a [`crate::Client`] reaches its servers.

use std::time::Duration;

/// Default time allowed to open a TCP (and TLS) connection to one endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default deadline of one call (a subscription's deadline covers only its start).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default number of endpoints a read tries, in turn, before it reports the failure.
pub const DEFAULT_READ_ATTEMPTS: u32 = 6;
/// Default attempts of one command in [`crate::Client::decide`] (each write, and each
/// read after a failed one, counts).
pub const DEFAULT_DECIDE_ATTEMPTS: u32 = 30;
/// First pause between retries; it doubles up to [`DEFAULT_MAX_BACKOFF`], with jitter.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(20);
/// Longest pause between retries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Default time a subscription keeps trying to resume before it reports the failure.
pub const DEFAULT_RESUME_TIMEOUT: Duration = Duration::from_secs(60);
/// Interval of HTTP/2 pings that detect a dead connection under an idle subscription.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Endpoints, credentials and retry settings of a [`crate::Client`].
///
/// ```no_run
/// # use cairn_client::ClientConfig;
/// let config = ClientConfig::new(["http://node-1:5005", "http://node-2:5005"])
///     .credentials("admin", "changeit");
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) tls_ca_pem: Option<Vec<u8>>,
    /// Client certificate chain and private key (PEM), for servers that ask for one.
    pub(crate) tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) read_attempts: u32,
    pub(crate) decide_attempts: u32,
    pub(crate) min_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) resume_timeout: Duration,
    pub(crate) random_start: bool,
}

impl ClientConfig {
    /// Servers to use, e.g. `http://127.0.0.1:5005`, or `https://…` for TLS.
    /// Every node of a Cairn cluster accepts every call; the client starts on a random one
    /// and moves to the next when one cannot be reached.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            credentials: None,
            tls_ca_pem: None,
            tls_identity: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            read_attempts: DEFAULT_READ_ATTEMPTS,
            decide_attempts: DEFAULT_DECIDE_ATTEMPTS,
            min_backoff: DEFAULT_MIN_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            resume_timeout: DEFAULT_RESUME_TIMEOUT,
            random_start: true,
        }
    }

    /// Logs in with HTTP Basic credentials; after the first reply the client sends the
    /// session token the server issued too, which spares the server a password check.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// Trusts the CA certificate `pem` for `https://` endpoints (default: the system's
    /// roots). Needs the `tls` feature (on by default).
    pub fn tls_ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// Presents this certificate chain and private key (both PEM) to servers that require
    /// client certificates (`cairn serve --tls-client-ca`). The certificate authenticates
    /// the connection only: calls still log in with [`ClientConfig::credentials`].
    pub fn tls_client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_identity = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Time allowed to open a connection to one endpoint.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Deadline of one call.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many times a read is tried, moving to the next endpoint after each failure
    /// that left it unanswered (at least 1).
    pub fn read_attempts(mut self, attempts: u32) -> Self {
        self.read_attempts = attempts.max(1);
        self
    }

    /// How many attempts [`crate::Client::decide`] makes for one command (at least 1).
    pub fn decide_attempts(mut self, attempts: u32) -> Self {
        self.decide_attempts = attempts.max(1);
        self
    }

    /// The pauses between retries: the first, doubling up to the longest.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }

    /// How long a subscription keeps trying to resume after a disconnect.
    pub fn resume_timeout(mut self, timeout: Duration) -> Self {
        self.resume_timeout = timeout;
        self
    }

    /// Start on the first endpoint rather than a random one.
    pub fn in_order(mut self) -> Self {
        self.random_start = false;
        self
    }
}
