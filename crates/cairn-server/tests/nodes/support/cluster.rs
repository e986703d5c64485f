//! A cluster of real `cairn` processes on one machine, with the peer traffic under the
//! test's control.
//!
//! Node `i` listens for peers on `127.0.0.(10+i)` and dials peers from that address. It
//! advertises `127.0.0.(30+i):P`, where the harness runs a TCP proxy to its real peer port;
//! the proxy tells links apart by the caller's source address. Cutting a link `i → j`
//! closes the proxy's connections from `i` to `j` and refuses new ones, which is a network
//! partition as the nodes see it (Raft messages, forwarded writes and read indexes alike),
//! with nothing in the product that knows about tests. Client calls go straight to each
//! node's client port. Every wait is on a condition with a deadline.
//!
//! [`Cluster::start_on_powercut_disks`] puts each node's data on a disk of its own
//! (`cairn-powercut`) whose power the test can cut: the node dies and the disk forgets
//! what it had not synced.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_powercut::{CutReport, Disk};
use cairn_proto::cairn_v1 as cluster_pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::peer_pki::{PeerCert, PeerPki};
use super::{Launching, Node};

/// The secret the harness's clusters share.
pub const SECRET: &str = "harness-cluster-secret";
/// Fast Raft timing, so failover tests take seconds.
const FAST_TIMING: [&str; 4] = [
    "--raft-heartbeat-ms",
    "100",
    "--raft-election-timeout-ms",
    "600",
];
/// How long conditions may take to hold before a test fails.
pub const WAIT: Duration = Duration::from_secs(30);
/// Interval between checks of a condition.
const POLL: Duration = Duration::from_millis(50);

fn peer_ip(id: u64) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 10 + id as u8)
}

/// The host node `id` advertises to its peers (its certificate's name with peer TLS).
pub fn advertised_host(id: u64) -> IpAddr {
    IpAddr::V4(proxy_ip(id))
}

fn proxy_ip(id: u64) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 30 + id as u8)
}

/// The node a peer connection comes from, by its source address (0: not a node).
fn source_node(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) if (11..30).contains(&v4.octets()[3]) => u64::from(v4.octets()[3] - 10),
        _ => 0,
    }
}

/// Which links are cut; every change bumps the epoch so open connections look again.
#[derive(Default)]
struct Links {
    cut: Mutex<HashSet<(u64, u64)>>,
    epoch: Mutex<Option<watch::Sender<u64>>>,
}

impl Links {
    fn is_cut(&self, from: u64, to: u64) -> bool {
        self.cut
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(from, to))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        let mut epoch = self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        epoch.get_or_insert_with(|| watch::channel(0).0).subscribe()
    }

    fn change(&self, f: impl FnOnce(&mut HashSet<(u64, u64)>)) {
        f(&mut self.cut.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(epoch) = self
            .epoch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            epoch.send_modify(|e| *e += 1);
        }
    }
}

/// Relays connections to node `to`'s current peer port unless their link is cut.
async fn run_proxy(
    listener: TcpListener,
    to: u64,
    upstream: Arc<Mutex<Option<SocketAddr>>>,
    links: Arc<Links>,
) {
    loop {
        let Ok((mut inbound, source)) = listener.accept().await else {
            return;
        };
        let from = source_node(source.ip());
        let target = *upstream.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(target), false) = (target, links.is_cut(from, to)) else {
            continue;
        };
        let links = links.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            let _ = outbound.set_nodelay(true);
            let _ = inbound.set_nodelay(true);
            let mut epoch = links.subscribe();
            let cut = async {
                while epoch.changed().await.is_ok() {
                    if links.is_cut(from, to) {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = cut => {}
            }
        });
    }
}

/// One member's place in the cluster: its proxy, data and (while it runs) process.
pub struct Member {
    /// Raft node id.
    pub id: u64,
    /// What peers dial (the proxy).
    pub advertise: SocketAddr,
    /// The running process, if any.
    pub node: Option<Node>,
    /// Its real peer port, learnt from its log.
    upstream: Arc<Mutex<Option<SocketAddr>>>,
    data_dir: PathBuf,
    args: Vec<String>,
    proxy: JoinHandle<()>,
}

impl Member {
    /// The running node (panics if it is down).
    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("the node runs")
    }

    /// Its data directory (the store is in `db/` below it).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Its real peer address (the cluster API, bypassing the proxy).
    pub fn peer_addr(&self) -> SocketAddr {
        self.upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expect("peer address known")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.proxy.abort();
    }
}

/// A cluster of real nodes.
pub struct Cluster {
    /// Members by id.
    pub members: BTreeMap<u64, Member>,
    /// The `--initial-members` the cluster was formed with.
    initial: String,
    links: Arc<Links>,
    /// Power-cut disks by member id, when the cluster runs on them. Declared after the
    /// members so their processes are gone before the disks are unmounted, and before the
    /// temp dir that holds the mount points.
    disks: BTreeMap<u64, Disk>,
    on_powercut_disks: bool,
    /// The cluster CA when peers speak mutual TLS, and the certificate the harness and
    /// `cairn cluster` present (it names no member).
    peer_tls: Option<(PeerPki, PeerCert)>,
    /// When the members' peer certificates expire (`None`: rcgen's far future).
    peer_cert_not_after: Option<i64>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes forming a new cluster and waits until every one serves.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        Cluster::start_with(n, extra, false).await
    }

    /// As [`Cluster::start`], each node's data on a power-cut disk of its own (needs root
    /// and /dev/fuse).
    pub async fn start_on_powercut_disks(n: u64, extra: &[&str]) -> Cluster {
        Cluster::start_with(n, extra, true).await
    }

    /// As [`Cluster::start`], the peers speaking mutual TLS: a CA made for the cluster,
    /// each node's certificate naming the host it advertises.
    pub async fn start_with_peer_tls(n: u64, extra: &[&str]) -> Cluster {
        Cluster::start_with_peer_tls_until(n, extra, None).await
    }

    /// As [`Cluster::start_with_peer_tls`], the members' certificates expiring at
    /// `not_after` (Unix seconds) when given.
    pub async fn start_with_peer_tls_until(
        n: u64,
        extra: &[&str],
        not_after: Option<i64>,
    ) -> Cluster {
        let mut cluster = Cluster::unstarted(false);
        let pki = PeerPki::new(cluster.dir.path(), "cluster");
        let tool = pki.issue("harness", &[]);
        cluster.peer_tls = Some((pki, tool));
        cluster.peer_cert_not_after = not_after;
        cluster.form(n, extra).await;
        cluster
    }

    async fn start_with(n: u64, extra: &[&str], on_powercut_disks: bool) -> Cluster {
        let mut cluster = Cluster::unstarted(on_powercut_disks);
        cluster.form(n, extra).await;
        cluster
    }

    fn unstarted(on_powercut_disks: bool) -> Cluster {
        Cluster {
            members: BTreeMap::new(),
            initial: String::new(),
            links: Arc::default(),
            disks: BTreeMap::new(),
            on_powercut_disks,
            peer_tls: None,
            peer_cert_not_after: None,
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// The cluster CA, when peers speak mutual TLS.
    pub fn peer_pki(&self) -> Option<&PeerPki> {
        self.peer_tls.as_ref().map(|(pki, _)| pki)
    }

    /// Starts `n` members forming a new cluster and waits until each votes.
    async fn form(&mut self, n: u64, extra: &[&str]) {
        for id in 1..=n {
            self.add_member(id).await;
        }
        let initial: Vec<String> = self
            .members
            .values()
            .map(|m| format!("{}={}", m.id, m.advertise))
            .collect();
        let initial = initial.join(",");
        self.initial = initial.clone();
        for id in 1..=n {
            let mut args = self.member_args(id);
            args.extend(["--initial-members".to_string(), initial.clone()]);
            args.extend(extra.iter().map(|s| s.to_string()));
            self.member_mut(id).args = args;
        }
        let launching: Vec<(u64, Launching)> = (1..=n).map(|id| (id, self.launch(id))).collect();
        for (id, launching) in launching {
            let node = launching.serving_async().await;
            self.member_mut(id).node = Some(node);
        }
        self.formed().await;
    }

    /// Waits until every node votes and counts every other as a voter. A member that asks
    /// the others after they formed the group cannot tell itself from a wiped node: it
    /// rejoins (learner, then voter), and until then the group has one voter less, which
    /// a test that stops a node right away must not start with.
    async fn formed(&self) {
        let ids = self.ids();
        wait_for("every initial member to vote", || async {
            for &id in &ids {
                let status = self.status(id).await.ok()?;
                let voters = status.members.iter().filter(|m| m.voter).count();
                if status.standing != "voting" || voters != ids.len() {
                    return None;
                }
            }
            Some(())
        })
        .await;
    }

    /// A proxy and data directory for node `id` (not started).
    async fn add_member(&mut self, id: u64) -> &mut Member {
        let listener = TcpListener::bind((proxy_ip(id), 0))
            .await
            .expect("bind the proxy (127.0.0.x addresses need Linux)");
        let advertise = listener.local_addr().expect("proxy address");
        let upstream: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let proxy = tokio::spawn(run_proxy(
            listener,
            id,
            upstream.clone(),
            self.links.clone(),
        ));
        let data_dir = if self.on_powercut_disks {
            let mountpoint = self.dir.path().join(format!("disk-{id}"));
            std::fs::create_dir(&mountpoint).expect("create a mount point");
            let disk = Disk::mount(&mountpoint).expect("mount a power-cut disk");
            self.disks.insert(id, disk);
            mountpoint.join("data")
        } else {
            self.dir.path().join(format!("node-{id}"))
        };
        let member = Member {
            id,
            advertise,
            node: None,
            upstream,
            data_dir,
            args: Vec::new(),
            proxy,
        };
        self.members.insert(id, member);
        self.member_mut(id)
    }

    /// Adds node `id` started with `--join` to the member `via`; returns once it serves.
    pub async fn join(&mut self, id: u64, via: u64, extra: &[&str]) {
        self.add_member(id).await;
        self.start_joining(id, via, extra).await;
    }

    /// Adds node `id` the way a StatefulSet grows: started with the formation's
    /// `--initial-members` (which do not list it) and its own advertised address, so it
    /// joins through them; returns once it serves.
    pub async fn join_as_later_member(&mut self, id: u64, extra: &[&str]) {
        self.add_member(id).await;
        let mut args = self.member_args(id);
        args.extend(["--initial-members".to_string(), self.initial.clone()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        self.member_mut(id).args = args;
        let node = self.launch(id).serving_async().await;
        self.member_mut(id).node = Some(node);
    }

    /// Deletes the data of node `id`, which must be down, as a replaced disk would, and
    /// starts it again with `--join` to the member `via` (its old start arguments would
    /// have it claim a place it no longer has); returns once it serves.
    pub async fn rejoin_wiped(&mut self, id: u64, via: u64, extra: &[&str]) {
        self.wipe(id);
        self.start_joining(id, via, extra).await;
    }

    /// Starts node `id` with `--join` to the member `via`, presenting `cert` and trusting
    /// the CA in `ca_file` on its peer port (instead of a certificate of the cluster CA
    /// naming its own host). A joining node serves only once it has joined: the process
    /// is returned as it starts.
    pub async fn join_presenting(
        &mut self,
        id: u64,
        via: u64,
        cert: &PeerCert,
        ca_file: &std::path::Path,
    ) -> Launching {
        self.add_member(id).await;
        let target = self.member(via).advertise;
        let mut args = member_args(id, &self.member(id).advertise);
        args.extend([
            "--peer-tls-cert".to_string(),
            cert.cert_file.display().to_string(),
            "--peer-tls-key".to_string(),
            cert.key_file.display().to_string(),
            "--peer-tls-ca".to_string(),
            ca_file.display().to_string(),
            "--join".to_string(),
            target.to_string(),
        ]);
        self.member_mut(id).args = args;
        self.launch(id)
    }

    async fn start_joining(&mut self, id: u64, via: u64, extra: &[&str]) {
        let target = self.member(via).advertise;
        let mut args = self.member_args(id);
        args.extend(["--join".to_string(), target.to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        self.member_mut(id).args = args;
        let node = self.launch(id).serving_async().await;
        self.member_mut(id).node = Some(node);
    }

    /// Member `id`.
    pub fn member(&self, id: u64) -> &Member {
        self.members.get(&id).expect("a member")
    }

    fn member_mut(&mut self, id: u64) -> &mut Member {
        self.members.get_mut(&id).expect("a member")
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> &Node {
        self.member(id).node()
    }

    /// Starts node `id`'s process with its arguments; its peer address reaches the proxy
    /// as soon as it logs it.
    fn launch(&self, id: u64) -> Launching {
        let member = self.member(id);
        let upstream = member.upstream.clone();
        *upstream.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let args: Vec<&str> = member.args.iter().map(String::as_str).collect();
        Node::launch(
            &member.data_dir,
            &args,
            Some(Box::new(move |line: &serde_json::Value| {
                if let Some(addr) = line["fields"]["peer_addr"].as_str()
                    && let Ok(addr) = addr.parse()
                {
                    *upstream.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
                }
            })),
        )
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut node) = self.member_mut(id).node.take() {
            node.kill();
        }
    }

    /// Starts node `id` again on its data directory (it must be down); returns once it serves.
    pub async fn restart(&mut self, id: u64) {
        assert!(self.member(id).node.is_none(), "node {id} still runs");
        let node = self.launch(id).serving_async().await;
        self.member_mut(id).node = Some(node);
    }

    /// Waits until node `id` votes again (a wiped node has rejoined and been promoted)
    /// and every running node counts it as a voter.
    pub async fn voting_everywhere(&self, id: u64) {
        wait_for(
            &format!("node {id} to be a voting member again"),
            || async {
                let own = self.status(id).await.ok()?;
                if own.standing != "voting" {
                    return None;
                }
                for other in self.running() {
                    let status = self.status(other).await.ok()?;
                    if !status.members.iter().any(|m| m.node_id == id && m.voter) {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
    }

    /// The ids of the nodes that run (not killed), paused ones included.
    pub fn running(&self) -> Vec<u64> {
        self.members
            .values()
            .filter(|m| m.node.is_some())
            .map(|m| m.id)
            .collect()
    }

    /// Deletes the data of node `id`, which must be down, as a lost volume would.
    pub fn wipe(&mut self, id: u64) {
        assert!(self.member(id).node.is_none(), "node {id} still runs");
        let data_dir = &self.member(id).data_dir;
        if data_dir.exists() {
            std::fs::remove_dir_all(data_dir).expect("wipe the data directory");
        }
        // A replaced disk stays empty: a later power cut must not bring the old data back.
        if let Some(disk) = self.disks.get(&id) {
            std::fs::File::open(disk.path())
                .and_then(|d| d.sync_all())
                .expect("sync the wiped disk");
        }
    }

    /// Cuts the power of node `id`: SIGKILL, and its disk forgets what it had not synced.
    /// The node stays down. Needs [`Cluster::start_on_powercut_disks`].
    pub fn power_cut(&mut self, id: u64) -> CutReport {
        self.kill(id);
        self.disks
            .get(&id)
            .expect("the cluster runs on power-cut disks")
            .power_cut()
    }

    /// Cuts the power of every node at once (a rack or a data centre going dark), starts
    /// them all again and returns, once each serves, what their disks lost.
    pub async fn power_cut_everything(&mut self) -> Vec<CutReport> {
        let ids = self.ids();
        for &id in &ids {
            self.kill(id);
        }
        let reports = ids.iter().map(|&id| self.power_cut(id)).collect();
        let launching: Vec<(u64, Launching)> =
            ids.iter().map(|&id| (id, self.launch(id))).collect();
        for (id, launching) in launching {
            let node = launching.serving_async().await;
            self.member_mut(id).node = Some(node);
        }
        reports
    }

    /// Starts node `id` again without waiting for it to serve.
    pub fn relaunch(&mut self, id: u64) -> Launching {
        assert!(self.member(id).node.is_none(), "node {id} still runs");
        self.launch(id)
    }

    /// Puts a relaunched node back in its place.
    pub fn adopt(&mut self, id: u64, node: Node) {
        self.member_mut(id).node = Some(node);
    }

    /// SIGSTOP: the process stays, frozen (a long GC pause, a VM stall).
    pub fn pause(&self, id: u64) {
        self.node(id).signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self, id: u64) {
        self.node(id).signal("CONT");
    }

    /// Cuts every link between the two sides, both ways.
    pub fn partition(&self, a: &[u64], b: &[u64]) {
        self.links.change(|cut| {
            for &x in a {
                for &y in b {
                    cut.insert((x, y));
                    cut.insert((y, x));
                }
            }
        });
    }

    /// Cuts the link `from → to` only: `to` hears nothing from `from` (a leader's log and
    /// heartbeats), while `from` answers what `to` asks it (forwarded writes, read indexes).
    pub fn cut(&self, from: u64, to: u64) {
        self.links.change(|cut| {
            cut.insert((from, to));
        });
    }

    /// Cuts `id` off from every other member.
    pub fn isolate(&self, id: u64) {
        let others: Vec<u64> = self.ids().into_iter().filter(|&o| o != id).collect();
        self.partition(&[id], &others);
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.links.change(|cut| cut.clear());
    }

    /// Ids of all members.
    pub fn ids(&self) -> Vec<u64> {
        self.members.keys().copied().collect()
    }

    /// A channel to node `id`'s real peer port; with peer TLS, presenting `cert` (by
    /// default the harness's, which names no member).
    pub fn peer_channel(&self, id: u64, cert: Option<&PeerCert>) -> Channel {
        let member = self.member(id);
        let endpoint = match &self.peer_tls {
            None => Channel::from_shared(format!("http://{}", member.peer_addr())).expect("uri"),
            Some((pki, tool)) => {
                let tls = cert
                    .unwrap_or(tool)
                    .dial(pki, &member.advertise.ip().to_string());
                Channel::from_shared(format!("https://{}", member.peer_addr()))
                    .expect("uri")
                    .tls_config(tls)
                    .expect("TLS config")
            }
        };
        endpoint
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect_lazy()
    }

    /// The cluster API of node `id`, on its real peer port.
    pub async fn cluster_api(&self, id: u64) -> ClusterClient<Channel> {
        ClusterClient::new(self.peer_channel(id, None))
    }

    /// `cairn cluster <args>` against node `id`'s real peer port; panics unless it
    /// succeeds, and returns what it printed.
    pub fn cli(&self, id: u64, args: &[&str]) -> String {
        self.try_cli(id, args)
            .unwrap_or_else(|stderr| panic!("cairn cluster {args:?}: {stderr}"))
    }

    /// `cairn cluster <args>` against node `id`: what it printed, or what it printed on
    /// stderr when it failed.
    pub fn try_cli(&self, id: u64, args: &[&str]) -> Result<String, String> {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("cluster")
            .args(args)
            .arg("--endpoint")
            .arg(self.member(id).peer_addr().to_string())
            .args(["--cluster-secret", SECRET])
            .args(self.cli_tls_args(id))
            .output()
            .expect("cairn cluster");
        if output.status.success() {
            Ok(String::from_utf8(output.stdout).expect("utf-8"))
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// The TLS flags of `cairn cluster` against node `id`: the CA, the harness's
    /// certificate, and the name node `id`'s certificate carries.
    fn cli_tls_args(&self, id: u64) -> Vec<String> {
        let Some((pki, tool)) = &self.peer_tls else {
            return Vec::new();
        };
        let mut args = vec!["--tls-ca".to_string(), pki.ca_file.display().to_string()];
        args.extend([
            "--tls-cert".to_string(),
            tool.cert_file.display().to_string(),
        ]);
        args.extend(["--tls-key".to_string(), tool.key_file.display().to_string()]);
        args.extend([
            "--tls-server-name".to_string(),
            self.member(id).advertise.ip().to_string(),
        ]);
        args
    }

    /// The start arguments every member gets; with peer TLS, a certificate naming the host
    /// it advertises.
    fn member_args(&self, id: u64) -> Vec<String> {
        let advertise = self.member(id).advertise;
        let mut args = member_args(id, &advertise);
        if let Some((pki, _)) = &self.peer_tls {
            let cert = pki.issue_until(
                &format!("node-{id}"),
                &[advertise.ip()],
                self.peer_cert_not_after,
            );
            args.extend(cert.serve_args(pki));
        }
        args
    }

    /// Node `id`'s view of the cluster (UNAVAILABLE until its peer address is known).
    pub async fn status(&self, id: u64) -> Result<cluster_pb::StatusResponse, tonic::Status> {
        let known = self
            .member(id)
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !known {
            return Err(tonic::Status::unavailable(
                "its peer address is not known yet",
            ));
        }
        self.cluster_api(id)
            .await
            .status(with_secret(cluster_pb::StatusRequest {}))
            .await
            .map(|r| r.into_inner())
    }

    /// Waits until the running nodes among `ids` agree on one leader, which is among them,
    /// and returns it.
    pub async fn leader_among(&self, ids: &[u64]) -> u64 {
        wait_for("the nodes to agree on a leader", move || async move {
            let mut leaders = HashSet::new();
            for &id in ids {
                let s = self.status(id).await.ok()?;
                leaders.insert((s.leader_id, s.term));
            }
            let (leader, _) = *leaders.iter().next()?;
            (leaders.len() == 1 && leader != 0 && ids.contains(&leader)).then_some(leader)
        })
        .await
    }

    /// Waits until every running node among `ids` has applied `index`.
    pub async fn applied_everywhere(&self, ids: &[u64], index: u64) {
        wait_for("every node to apply the log", move || async move {
            for &id in ids {
                let s = self.status(id).await.ok()?;
                if s.applied_index < index {
                    return None;
                }
            }
            Some(())
        })
        .await
    }
}

/// A cluster-API request carrying the harness's secret.
pub fn with_secret<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        cairn_proto::CLUSTER_SECRET_HEADER,
        SECRET.parse().expect("ascii"),
    );
    request
}

fn member_args(id: u64, advertise: &SocketAddr) -> Vec<String> {
    let mut args = vec![
        "--node-id".to_string(),
        id.to_string(),
        "--peer-listen".to_string(),
        SocketAddr::new(IpAddr::V4(peer_ip(id)), 0).to_string(),
        "--advertise-addr".to_string(),
        advertise.to_string(),
        "--cluster-secret".to_string(),
        SECRET.to_string(),
        "--leader-wait-ms".to_string(),
        "5000".to_string(),
        // The tests log in as admin/changeit on every node.
        "--allow-default-password".to_string(),
    ];
    args.extend(FAST_TIMING.iter().map(|s| s.to_string()));
    args
}

/// Polls `condition` until it yields a value, or panics after [`WAIT`] naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {}s waiting for {what}",
            WAIT.as_secs()
        );
        tokio::time::sleep(POLL).await;
    }
}
