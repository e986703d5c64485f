//! A real Prometheus (`../shared/tools/prometheus`) scraping test nodes every second and
//! evaluating the shipped alert rules, queried over its HTTP API.

use std::path::PathBuf;
use std::process::Command;

use super::cluster::wait_for;

fn tool() -> PathBuf {
    match std::env::var_os("CAIRN_SHARED_TOOLS") {
        Some(dir) => PathBuf::from(dir).join("prometheus"),
        None => super::repo_root().join("../shared/tools/prometheus"),
    }
}

/// The shipped alert rules, with every `for:` shortened to zero so an alert fires on the
/// first evaluation its expression holds (the expressions themselves are unchanged).
pub fn alert_rules_without_delays() -> String {
    let path = super::repo_root().join("deploy/prometheus/cairn-rules.yaml");
    let rules = std::fs::read_to_string(&path).expect("deploy/prometheus/cairn-rules.yaml");
    rules
        .lines()
        .map(|line| match line.split_once("for:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 0s"),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running Prometheus; stopped when dropped.
pub struct Prometheus {
    dir: tempfile::TempDir,
    /// Its HTTP API, `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (host:port of `/metrics`) as job `cairn`,
    /// evaluating `rules` (a rule file's text) every second.
    pub fn start(targets: &[std::net::SocketAddr], rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("dir");
        let status = Command::new(tool())
            .arg("start")
            .arg(dir.path())
            .args(targets.iter().map(|t| t.to_string()))
            .status()
            .expect("run ../shared/tools/prometheus");
        assert!(status.success(), "prometheus started");
        let url = std::fs::read_to_string(dir.path().join("url"))
            .expect("url")
            .trim()
            .to_string();
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("rules");
        let config = dir.path().join("prometheus.yml");
        let mut text = std::fs::read_to_string(&config).expect("prometheus.yml");
        text.push_str("rule_files: [rules.yaml]\n");
        std::fs::write(&config, text).expect("prometheus.yml");
        let reload = Command::new("curl")
            .args(["-sf", "-X", "POST", &format!("{url}/-/reload")])
            .status()
            .expect("curl");
        assert!(reload.success(), "prometheus reloaded its configuration");
        Prometheus { dir, url }
    }

    /// The first sample of an instant query, if any.
    pub fn value(&self, query: &str) -> Option<f64> {
        let out = Command::new("curl")
            .args([
                "-sfG",
                &format!("{}/api/v1/query", self.url),
                "--data-urlencode",
            ])
            .arg(format!("query={query}"))
            .output()
            .expect("curl");
        let body: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        body["data"]["result"].get(0)?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }

    /// The alerts firing now, as (alert name, labels).
    pub fn firing(&self) -> Vec<(String, serde_json::Value)> {
        let out = Command::new("curl")
            .args(["-sf", &format!("{}/api/v1/alerts", self.url)])
            .output()
            .expect("curl");
        let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        body["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                let labels = a["labels"].clone();
                (
                    labels["alertname"].as_str().unwrap_or("").to_string(),
                    labels,
                )
            })
            .collect()
    }

    /// Waits until alert `name` fires with labels satisfying `matches`; returns its labels.
    pub async fn await_firing(
        &self,
        name: &str,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(&format!("alert {name} to fire"), || {
            let found = self
                .firing()
                .into_iter()
                .find(|(alert, labels)| alert == name && matches(labels))
                .map(|(_, labels)| labels);
            async move { found }
        })
        .await
    }

    /// Whether alert `name` fires now.
    pub fn fires(&self, name: &str) -> bool {
        self.firing().iter().any(|(alert, _)| alert == name)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new(tool())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}
