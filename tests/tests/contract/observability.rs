//! Metrics against the real tools: Prometheus scraping a node, promtool linting the
//! exposition. Ignored by default (they need `../shared/tools/prometheus`); `.ci/run` runs
//! them with `--ignored`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_tests::*;

fn prometheus_tool() -> PathBuf {
    match std::env::var_os("CAIRN_SHARED_TOOLS") {
        Some(dir) => PathBuf::from(dir).join("prometheus"),
        None => repo_root().join("../shared/tools/prometheus"),
    }
}

/// The body of `GET path`.
async fn http_body(addr: std::net::SocketAddr, path: &str) -> String {
    http_get(addr, path)
        .await
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// Evaluates an instant query; returns the first sample's value, if any.
fn prom_query(url: &str, query: &str) -> Option<f64> {
    let out = Command::new("curl")
        .args(["-sfG", &format!("{url}/api/v1/query"), "--data-urlencode"])
        .arg(format!("query={query}"))
        .output()
        .expect("curl");
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let value = body["data"]["result"].get(0)?["value"][1]
        .as_str()?
        .to_string();
    value.parse().ok()
}

struct Prometheus {
    dir: tempfile::TempDir,
    url: String,
}

impl Prometheus {
    fn start(target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("dir");
        let status = Command::new(prometheus_tool())
            .arg("start")
            .arg(dir.path())
            .arg(target.to_string())
            .status()
            .expect("run ../shared/tools/prometheus");
        assert!(status.success(), "prometheus started");
        let url = std::fs::read_to_string(dir.path().join("url"))
            .expect("url")
            .trim()
            .to_string();
        Prometheus { dir, url }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new(prometheus_tool())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// Waits until Prometheus reports exactly `want` for `query`.
fn await_value(url: &str, query: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        last = prom_query(url, query);
        if last == Some(want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{query}: Prometheus reports {last:?}, the test produced {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Prometheus (../shared/tools/prometheus); run by .ci/run with --ignored"]
async fn prometheus_scrapes_exact_commit_and_conflict_counts() {
    let server = TestServer::start().await;
    server.create_boundary("ledger").await;
    let prom = Prometheus::start(server.http_addr);
    let mut c = server.client();
    let (mut writes, mut events, mut conflicts) = (0u32, 0u32, 0u32);
    let context = query(vec![criterion(&[("account", "a")])]);
    for i in 0..37u32 {
        let n = 1 + i % 4;
        c.save(
            "ledger",
            (0..n)
                .map(|_| event("Posted", r#"{"account":"a"}"#))
                .collect(),
            vec![],
        )
        .await
        .expect("write");
        writes += 1;
        events += n;
        if i % 3 == 0 {
            // A deliberately stale observation: the context has moved past (-1,-1).
            let status = c
                .save(
                    "ledger",
                    vec![event("Posted", "{}")],
                    vec![observe(context.clone(), none_pos())],
                )
                .await
                .expect_err("conflict");
            assert_eq!(status.code(), tonic::Code::AlreadyExists);
            conflicts += 1;
        }
    }
    let url = prom.url.clone();
    tokio::task::spawn_blocking(move || {
        await_value(&url, r#"cairn_writes_committed_total{boundary="ledger"}"#, writes.into());
        await_value(&url, r#"cairn_events_committed_total{boundary="ledger"}"#, events.into());
        await_value(&url, r#"cairn_ccc_conflicts_total{boundary="ledger"}"#, conflicts.into());
        await_value(
            &url,
            r#"cairn_grpc_requests_total{method="orisun.EventStore/SaveEventsV2",code="ALREADY_EXISTS"}"#,
            conflicts.into(),
        );
        let observed = prom_query(
            &url,
            r#"sum(cairn_grpc_request_duration_seconds_count{method="orisun.EventStore/SaveEventsV2"})"#,
        )
        .expect("latency histogram");
        assert_eq!(observed, f64::from(writes + conflicts), "every write observed once");
        let p99 = prom_query(
            &url,
            r#"histogram_quantile(0.99, sum by (le) (cairn_grpc_request_duration_seconds_bucket{method="orisun.EventStore/SaveEventsV2"}))"#,
        )
        .expect("p99");
        assert!(p99 > 0.0 && p99.is_finite(), "p99 {p99}");
    })
    .await
    .expect("queries");
    drop(prom);
}

#[tokio::test]
#[ignore = "needs promtool (../shared/tools/prometheus); run by .ci/run with --ignored"]
async fn promtool_finds_nothing_to_report_in_the_exposition() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("write");
    c.save(
        "default",
        vec![event("T", "{}")],
        vec![observe(
            query(vec![criterion(&[("eventType", "T")])]),
            none_pos(),
        )],
    )
    .await
    .expect_err("conflict");
    let _ = c.es.ping(cairn_tests::orisun::PingRequest {}).await;
    let exposition = http_body(server.http_addr, "/metrics").await;
    assert!(exposition.contains("cairn_events_committed_total"));
    let mut child = Command::new(prometheus_tool())
        .args(["promtool", "check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("feed");
    let out = child.wait_with_output().expect("promtool ran");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool: {report}"
    );
}
