//! The real `cairn` binary as a child process, for black-box tests: started with
//! `--listen 127.0.0.1:0`, its addresses read from its own "cairn is serving" log line.

pub mod cluster;
pub mod lossy;
pub mod peer_pki;
pub mod prometheus;
pub mod s3;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tonic::Request;
use tonic::transport::Channel;

/// How long a node may take to report that it serves.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `cairn serve` process; killed when dropped.
pub struct Node {
    child: Option<Child>,
    /// Client gRPC address.
    pub addr: SocketAddr,
    /// HTTP (probes, metrics) address.
    pub http_addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

/// Log lines of each node a failing test prints.
const LOG_LINES_ON_FAILURE: usize = 60;

/// A `cairn serve` process that has not yet reported that it serves.
pub struct Launching {
    child: Child,
    serving: std::sync::mpsc::Receiver<(String, String)>,
    log: Arc<Mutex<Vec<String>>>,
}

/// What a log line says, for the reader thread's callers.
pub type LogWatcher = Box<dyn FnMut(&serde_json::Value) + Send>;

impl Node {
    /// Starts `cairn serve` on ephemeral loopback ports with `data_dir` and any `extra`
    /// flags, and waits until it serves. Nothing else is set: every other flag keeps its
    /// default, as for a user typing `cairn serve`.
    pub fn spawn(data_dir: &Path, extra: &[&str]) -> Node {
        Node::launch(data_dir, extra, None).serving()
    }

    /// Starts `cairn serve` like [`Node::spawn`] without waiting; `watch` sees every log
    /// line as it arrives (e.g. to learn the peer address before the node serves).
    pub fn launch(data_dir: &Path, extra: &[&str], mut watch: Option<LogWatcher>) -> Launching {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--log-format", "json"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn");
        let stderr = child.stderr.take().expect("stderr");
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if let Some(watch) = watch.as_mut() {
                        watch(&v);
                    }
                    if !sent && v["fields"]["message"] == "cairn is serving" {
                        let addr =
                            |key: &str| v["fields"][key].as_str().unwrap_or_default().to_string();
                        let _ = tx.send((addr("grpc_addr"), addr("http_addr")));
                        sent = true;
                    }
                }
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Launching {
            child,
            serving: rx,
            log,
        }
    }

    /// A new connection to the node's client port.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }

    /// The process id (signals).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends `signal` (e.g. "STOP", "CONT") to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
        }
    }

    /// Waits up to `within` for the process to exit on its own; its status, if it did.
    pub async fn exited(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("wait") {
                self.child = None;
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process has logged a line containing `needle` so far.
    pub fn logged(&self, needle: &str) -> bool {
        logged(&self.log, needle)
    }

    /// Field `field` of the first log line whose message is `message`.
    pub fn log_field(&self, message: &str, field: &str) -> Option<String> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().find_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            (v["fields"]["message"] == message)
                .then(|| v["fields"][field].as_str().map(str::to_string))?
        })
    }

    /// SIGTERM, and wait for the process to exit.
    pub async fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -TERM failed");
        tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("join")
            .expect("wait")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test says what the nodes were doing: elections, errors.
        if std::thread::panicking() {
            let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let tail = log.len().saturating_sub(LOG_LINES_ON_FAILURE);
            eprintln!("--- the last log lines of the node at {} ---", self.addr);
            for line in &log[tail..] {
                eprintln!("{line}");
            }
        }
    }
}

impl Launching {
    /// Whether the process has logged a line containing `needle` so far.
    pub fn logged(&self, needle: &str) -> bool {
        logged(&self.log, needle)
    }

    /// Waits up to `within` for a process that is not to serve to exit; its status, if
    /// it did.
    pub async fn exited(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, and reap: for a process that was never to serve.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until the node serves (panics with its log after a minute).
    pub fn serving(mut self) -> Node {
        let (addr, http_addr) = match self.serving.recv_timeout(START_TIMEOUT) {
            Ok(addrs) => addrs,
            Err(_) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let output = self
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .join("\n");
                panic!("cairn did not report that it serves; its log:\n{output}");
            }
        };
        Node {
            child: Some(self.child),
            addr: addr.parse().expect("gRPC address"),
            http_addr: http_addr.parse().expect("HTTP address"),
            log: self.log,
        }
    }

    /// Waits for the node off the async threads.
    pub async fn serving_async(self) -> Node {
        tokio::task::spawn_blocking(move || self.serving())
            .await
            .expect("join")
    }
}

fn logged(log: &Mutex<Vec<String>>, needle: &str) -> bool {
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    log.iter().any(|line| line.contains(needle))
}

/// `msg` with Basic credentials.
pub fn with_basic<T>(msg: T, user: &str, password: &str) -> Request<T> {
    let mut r = Request::new(msg);
    let value = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    r.metadata_mut().insert(
        "authorization",
        format!("Basic {value}").parse().expect("header"),
    );
    r
}

/// `msg` as the default bootstrap admin.
pub fn admin<T>(msg: T) -> Request<T> {
    with_basic(msg, "admin", "changeit")
}

/// The repository's root. Cargo sets `CARGO_MANIFEST_DIR` for the test processes it runs;
/// the compile-time value is only a fallback, since a test binary built in another checkout
/// sharing the target directory would otherwise read that checkout's files.
pub fn repo_root() -> std::path::PathBuf {
    let manifest =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&manifest).join("../..")
}

/// The body of an HTTP/1.0 GET of `path` from `addr` (headers included).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("response");
    body
}

/// The value of an unlabelled series in a Prometheus exposition.
pub fn metric(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no series {name}"))
}

/// Creates user `username` with role OPERATIONS through `node`, as the admin.
pub async fn create_user(node: &Node, username: &str, password: &str) {
    cairn_proto::orisun::admin_client::AdminClient::new(node.channel().await)
        .create_user(admin(cairn_proto::orisun::CreateUserRequest {
            name: username.into(),
            username: username.into(),
            password: password.into(),
            roles: vec!["OPERATIONS".into()],
        }))
        .await
        .expect("create user");
}
