//! A test "kubelet": it runs the Pods of one namespace as real `cairn` processes, as a node's
//! kubelet would run their containers, so the operator's StatefulSets become real clusters.
//!
//! Per pod incarnation (one Pod uid):
//! - a fresh address a.b.c.N of the pod network the caller gives (a prefix routed to the
//!   loopback interface) as the pod IP; `0.0.0.0:port` in the container's env and args
//!   becomes `IP:port` (every pod would otherwise bind the same ports);
//! - a private mount namespace (`unshare -m`) where one shared hosts file, rewritten as pods
//!   come and go, is bind-mounted over `/etc/hosts`: the pods' stable DNS names
//!   (`pod.subdomain.namespace.svc`) resolve to their current IPs, as cluster DNS would;
//! - the container's env as Kubernetes builds it: `envFrom` ConfigMaps, then `env` with
//!   `$(VAR)` expansion, `fieldRef` and `secretKeyRef`; `HOSTNAME` is the pod name;
//! - volumes as directories: a PersistentVolumeClaim is a directory named by the claim's uid
//!   (a recreated pod finds its data again; a deleted and recreated claim is empty), a Secret
//!   volume a directory of its keys. Paths under a mount path are rewritten to the directory;
//! - the status a kubelet reports: podIP, phase Running, and the Ready condition from the
//!   container's HTTP readiness probe, polled.
//!
//! The kubelet registers a Node and binds every pod of the namespace to it (there is no
//! scheduler), so deletion is graceful as on a real node: the API server marks the Pod, the
//! kubelet stops its process (SIGTERM, then SIGKILL after the grace period) and then removes
//! the Pod; the StatefulSet controller creates it again and it starts on the same volume.
//! The image is not pulled: every container runs the `cairn` binary this build made.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

/// How often readiness probes run.
const PROBE_INTERVAL: Duration = Duration::from_millis(300);
/// The Node this kubelet registers and binds pods to.
pub const NODE_NAME: &str = "test-kubelet";
/// A pod with this label is left alone: the test runs whatever stands behind it (a rogue
/// pod's listeners) and reports its status itself.
pub const NOT_RUN_LABEL: &str = "test.cairn.dev/not-run";

/// The kubelet of one namespace; stops every process when dropped.
pub struct Kubelet {
    shared: Arc<Shared>,
    watch: tokio::task::JoinHandle<()>,
}

struct Shared {
    client: Client,
    namespace: String,
    binary: PathBuf,
    dir: tempfile::TempDir,
    /// a.b.c.0/24: the pods' addresses.
    prefix: [u8; 3],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_host: u8,
    pods: BTreeMap<String, Running>,
    /// Pod name → (DNS names, IP) for the hosts file.
    hosts: BTreeMap<String, (Vec<String>, Ipv4Addr)>,
}

struct Running {
    uid: String,
    ip: Ipv4Addr,
    child: tokio::process::Child,
    grace: Duration,
    prober: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    /// Registers the Node and starts running the pods of `namespace` with `binary` as every
    /// container's image, on addresses `network.N`.
    pub async fn start(
        client: Client,
        namespace: &str,
        binary: PathBuf,
        network: [u8; 3],
    ) -> Kubelet {
        assert!(
            is_root(),
            "the test kubelet needs root (unshare -m and bind mounts over /etc/hosts)"
        );
        let dir = tempfile::tempdir().expect("kubelet dir");
        for sub in ["volumes", "secrets", "logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("kubelet dirs");
        }
        std::fs::write(dir.path().join("hosts"), "127.0.0.1 localhost\n").expect("hosts");
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": NODE_NAME, "labels": { "kubernetes.io/hostname": NODE_NAME } },
        }))
        .expect("node");
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("register the node");
        let shared = Arc::new(Shared {
            client,
            namespace: namespace.to_string(),
            binary,
            dir,
            prefix: network,
            state: Mutex::new(State {
                next_host: 1,
                ..State::default()
            }),
        });
        let watch = tokio::spawn(watch(shared.clone()));
        Kubelet { shared, watch }
    }

    /// The IP of `pod`'s current incarnation, when it runs.
    pub async fn ip(&self, pod: &str) -> Option<Ipv4Addr> {
        self.shared.state.lock().await.pods.get(pod).map(|p| p.ip)
    }

    /// The pods running now.
    pub async fn running(&self) -> Vec<String> {
        self.shared
            .state
            .lock()
            .await
            .pods
            .keys()
            .cloned()
            .collect()
    }

    /// The last lines of every process's log (current and past incarnations).
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut entries: Vec<_> = std::fs::read_dir(self.shared.dir.path().join("logs"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for path in entries {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("==> {} <==\n", path.display()));
            for line in &all[all.len().saturating_sub(lines)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.watch.abort();
        if let Ok(mut state) = self.shared.state.try_lock() {
            for (_, mut pod) in std::mem::take(&mut state.pods) {
                pod.prober.abort();
                let _ = pod.child.start_kill();
            }
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

async fn watch(shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let mut events = watcher(pods, watcher::Config::default()).boxed();
    // One event at a time: a recreated pod starts only after its predecessor has stopped,
    // as both use the same volume.
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))
                if pod.labels().contains_key(NOT_RUN_LABEL) => {}
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let bound =
                    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME);
                if pod.metadata.deletion_timestamp.is_some() {
                    stop(&shared, &pod).await;
                    remove(&shared, &pod).await;
                } else if !bound {
                    bind(&shared, &pod).await;
                } else if let Err(e) = ensure_running(&shared, &pod).await {
                    eprintln!(
                        "kubelet: failed to start {}: {e}",
                        pod.metadata.name.as_deref().unwrap_or("?")
                    );
                }
            }
            Ok(watcher::Event::Delete(pod)) => stop(&shared, &pod).await,
            Ok(_) => {}
            Err(e) => eprintln!("kubelet: watch error: {e}"),
        }
    }
}

/// What the scheduler would do: put the pod on this kubelet's Node.
async fn bind(shared: &Shared, pod: &Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": { "name": name },
        "target": { "apiVersion": "v1", "kind": "Node", "name": NODE_NAME },
    });
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let result: Result<serde_json::Value, _> = pods
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await;
    if let Err(e) = result {
        eprintln!("kubelet: failed to bind {name}: {e}");
    }
}

/// The last step of a graceful deletion: the process has stopped, the Pod object goes.
async fn remove(shared: &Shared, pod: &Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: pod
            .metadata
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..DeleteParams::default()
    };
    match pods.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => eprintln!("kubelet: failed to remove {name}: {e}"),
    }
}

async fn stop(shared: &Shared, pod: &Pod) {
    let Some(name) = pod.metadata.name.clone() else {
        return;
    };
    let running = {
        let mut state = shared.state.lock().await;
        match state.pods.get(&name) {
            Some(r) if Some(&r.uid) == pod.metadata.uid.as_ref() => {
                state.hosts.remove(&name);
                state.pods.remove(&name)
            }
            _ => None,
        }
    };
    if let Some(running) = running {
        terminate(running).await;
        write_hosts(shared).await;
    }
}

async fn terminate(mut running: Running) {
    running.prober.abort();
    if let Some(pid) = running.child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(running.grace, running.child.wait())
        .await
        .is_err()
    {
        let _ = running.child.kill().await;
    }
}

async fn ensure_running(shared: &Shared, pod: &Pod) -> anyhow::Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let previous = {
        let mut state = shared.state.lock().await;
        match state.pods.get(&name) {
            Some(r) if r.uid == uid => return Ok(()),
            Some(_) => state.pods.remove(&name),
            None => None,
        }
    };
    if let Some(previous) = previous {
        // Its deletion went unseen (a watch restart): the old incarnation goes first.
        terminate(previous).await;
    }
    let spec = pod.spec.as_ref().context("pod spec")?;
    let container = spec.containers.first().context("a container")?;

    let ip = {
        let mut state = shared.state.lock().await;
        let host = state.next_host;
        state.next_host = state.next_host.checked_add(1).context("addresses")?;
        Ipv4Addr::new(shared.prefix[0], shared.prefix[1], shared.prefix[2], host)
    };

    // Volumes as directories, and the mount paths they replace.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .context("the mounted volume")?;
        let dir = if let Some(claim) = &volume.persistent_volume_claim {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(shared.client.clone(), &shared.namespace);
            let claim = claims.get(&claim.claim_name).await?;
            let dir = shared
                .dir
                .path()
                .join("volumes")
                .join(claim.metadata.uid.unwrap_or_default());
            std::fs::create_dir_all(&dir)?;
            dir
        } else if let Some(source) = &volume.secret {
            let secrets: Api<Secret> = Api::namespaced(shared.client.clone(), &shared.namespace);
            let secret = secrets
                .get(source.secret_name.as_deref().unwrap_or_default())
                .await?;
            let dir = shared
                .dir
                .path()
                .join("secrets")
                .join(format!("{uid}-{}", volume.name));
            std::fs::create_dir_all(&dir)?;
            for (key, value) in secret.data.unwrap_or_default() {
                std::fs::write(dir.join(key), value.0)?;
            }
            dir
        } else {
            anyhow::bail!(
                "volume {} has a source this kubelet does not run",
                volume.name
            );
        };
        mounts.push((mount.mount_path.clone(), dir));
    }
    let rewrite = |value: &str| -> String {
        let mut value = value.replace("0.0.0.0:", &format!("{ip}:"));
        for (path, dir) in &mounts {
            if let Some(rest) = value.strip_prefix(path.as_str()) {
                value = format!("{}{rest}", dir.display());
            }
        }
        value
    };

    // The environment, in Kubernetes' order: envFrom, then env (later wins).
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for source in container.env_from.iter().flatten() {
        if let Some(reference) = &source.config_map_ref {
            let maps: Api<ConfigMap> = Api::namespaced(shared.client.clone(), &shared.namespace);
            for (k, v) in maps.get(&reference.name).await?.data.unwrap_or_default() {
                env.insert(k, v);
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                match field.field_path.as_str() {
                    "metadata.name" => name.clone(),
                    "metadata.namespace" => shared.namespace.clone(),
                    "status.podIP" => ip.to_string(),
                    other => anyhow::bail!("fieldRef {other} is not supported here"),
                }
            } else if let Some(key) = &from.secret_key_ref {
                let secrets: Api<Secret> =
                    Api::namespaced(shared.client.clone(), &shared.namespace);
                let secret = secrets.get(&key.name).await?;
                let bytes = secret
                    .data
                    .and_then(|mut d| d.remove(&key.key))
                    .context("the secret key")?;
                String::from_utf8(bytes.0)?
            } else {
                anyhow::bail!("env {} has a source this kubelet does not run", var.name);
            }
        } else {
            String::new()
        };
        env.insert(var.name.clone(), value);
    }
    env.insert("HOSTNAME".into(), name.clone());
    let env: BTreeMap<String, String> = env.into_iter().map(|(k, v)| (k, rewrite(&v))).collect();
    let args: Vec<String> = container
        .command
        .iter()
        .flatten()
        .skip(1)
        .chain(container.args.iter().flatten())
        .map(|a| rewrite(&expand(a, &env)))
        .collect();

    // DNS first: the node dials its peers by name as soon as it starts.
    {
        let mut state = shared.state.lock().await;
        if let Some(subdomain) = &spec.subdomain {
            let host = spec.hostname.clone().unwrap_or_else(|| name.clone());
            let fqdn = format!("{host}.{subdomain}.{}.svc", shared.namespace);
            state.hosts.insert(
                name.clone(),
                (vec![format!("{fqdn}.cluster.local"), fqdn], ip),
            );
        }
    }
    write_hosts(shared).await;

    let log = shared
        .dir
        .path()
        .join("logs")
        .join(format!("{name}-{}.log", &uid[..8.min(uid.len())]));
    let out = std::fs::File::create(&log)?;
    let child = tokio::process::Command::new("unshare")
        .arg("-m")
        .arg("sh")
        .arg("-c")
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(shared.dir.path().join("hosts"))
        .arg(&shared.binary)
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()?;

    let probe_port = readiness_port(container);
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    patch_status(&pods, &name, ip, false).await?;
    let prober = tokio::spawn(probe(pods, name.clone(), ip, probe_port));
    let grace = Duration::from_secs(
        spec.termination_grace_period_seconds
            .unwrap_or(30)
            .try_into()
            .unwrap_or(30),
    );
    shared.state.lock().await.pods.insert(
        name,
        Running {
            uid,
            ip,
            child,
            grace,
            prober,
        },
    );
    Ok(())
}

/// `$(VAR)` from the variables defined so far, as Kubernetes expands env values and args.
fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = value.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

fn readiness_port(container: &k8s_openapi::api::core::v1::Container) -> Option<(u16, String)> {
    let probe = container.readiness_probe.as_ref()?.http_get.as_ref()?;
    let port = match &probe.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))?
                .container_port
        }
    };
    Some((
        u16::try_from(port).ok()?,
        probe.path.clone().unwrap_or_else(|| "/".into()),
    ))
}

async fn probe(pods: Api<Pod>, name: String, ip: Ipv4Addr, port: Option<(u16, String)>) {
    let mut ready = false;
    loop {
        let now = match &port {
            Some((port, path)) => http_ok(ip, *port, path).await,
            None => true,
        };
        if now != ready {
            match patch_status(&pods, &name, ip, now).await {
                Ok(()) => ready = now,
                Err(e) => eprintln!("kubelet: failed to report {name} ready={now}: {e}"),
            }
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

async fn http_ok(ip: Ipv4Addr, port: u16, path: &str) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.1 2"))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Reports pod `name` Running at `ip`, Ready or not, as a kubelet does.
pub(crate) async fn patch_status(
    pods: &Api<Pod>,
    name: &str,
    ip: Ipv4Addr,
    ready: bool,
) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let flag = if ready { "True" } else { "False" };
    let condition = |type_: &str, status: &str| serde_json::json!({ "type": type_, "status": status, "lastTransitionTime": now });
    let status = serde_json::json!({
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip.to_string(),
            "podIPs": [{ "ip": ip.to_string() }],
            "startTime": now,
            "conditions": [
                condition("PodScheduled", "True"),
                condition("Initialized", "True"),
                condition("ContainersReady", flag),
                condition("Ready", flag),
            ],
            "containerStatuses": [{
                "name": "cairn",
                "image": "cairn",
                "imageID": "",
                "ready": ready,
                "started": true,
                "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            }],
        }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn write_hosts(shared: &Shared) {
    let state = shared.state.lock().await;
    let mut text = String::from("127.0.0.1 localhost\n");
    for (names, ip) in state.hosts.values() {
        text.push_str(&format!("{ip} {}\n", names.join(" ")));
    }
    // In place (same inode): the file is bind-mounted into every pod's namespace.
    let path: &Path = &shared.dir.path().join("hosts");
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("kubelet: failed to write {}: {e}", path.display());
    }
}
