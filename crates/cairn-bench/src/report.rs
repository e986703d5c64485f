//! Output: the anchor CSV columns exactly, and a JSON report with everything.

use std::path::Path;

use anyhow::Context;

use crate::runner::RunResult;

/// The anchor CSVs' header, column for column.
pub const CSV_HEADER: &str = "scenario,clients,events_per_request,requests,events,errors,requests_per_second,events_per_second,p50_ms,p95_ms,p99_ms,max_ms,background_kind,background_clients,background_requests,background_events,background_errors,background_requests_per_second,background_events_per_second";

/// All results of one invocation.
#[derive(Debug, Default)]
pub struct Report {
    /// Rows in run order.
    pub results: Vec<RunResult>,
}

impl Report {
    /// The CSV text.
    pub fn csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        out.push('\n');
        for r in &self.results {
            out.push_str(&format!(
                "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{},{:.3},{:.3}\n",
                r.scenario,
                r.clients,
                r.events_per_request,
                r.requests,
                r.events,
                r.errors,
                r.requests_per_second,
                r.events_per_second,
                r.p50_ms,
                r.p95_ms,
                r.p99_ms,
                r.max_ms,
                r.background_kind,
                r.background_clients,
                r.background_requests,
                r.background_events,
                r.background_errors,
                r.background_requests_per_second,
                r.background_events_per_second
            ));
        }
        out
    }

    /// Writes the CSV.
    pub fn write_csv(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.csv())
            .with_context(|| format!("failed to write {}", path.display()))
    }

    /// Writes the JSON report.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(&self.results)?;
        std::fs::write(path, json).with_context(|| format!("failed to write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_the_anchors() {
        let anchors = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/anchors/orisun-postgres-2026-07-30.csv"
        );
        if let Ok(text) = std::fs::read_to_string(anchors) {
            assert_eq!(text.lines().next(), Some(CSV_HEADER));
        }
        assert_eq!(CSV_HEADER.split(',').count(), 19);
    }
}
