//! cairn-bench against a real node, over both transports: every scenario runs without
//! errors and reports what the server actually did.

use std::process::Command;

use cairn_proto::orisun as pb;
use cairn_tests::TestServer;

const SEED: u64 = 2_000;

/// Each transport gets its own freshly seeded boundary: command-cycle writes into seeded
/// contexts, which would change what a later run reads.
fn boundary(transport: &str) -> String {
    format!("bench_{transport}")
}

fn run_bench(server: &TestServer, transport: &str, out: &std::path::Path) -> serde_json::Value {
    let status = Command::new(env!("CARGO_BIN_EXE_cairn-bench"))
        .args([
            "--endpoints",
            &format!("http://{}", server.addr),
            "--boundary",
            &boundary(transport),
            "--seed-events",
            &SEED.to_string(),
            "--seed-batch",
            "500",
            "--scenarios",
            "write-conditional-1,write-conditional-100,read-conditional,read-unconditional,latest-by-criteria,command-cycle",
            "--clients",
            "3",
            "--warmup-secs",
            "0",
            "--duration-secs",
            "1",
            "--transport",
            transport,
            "--quiet",
            "--json",
        ])
        .arg(out)
        .status()
        .expect("cairn-bench runs");
    assert!(
        status.success(),
        "cairn-bench --transport {transport} failed: {status}"
    );
    serde_json::from_slice(&std::fs::read(out).expect("report")).expect("JSON report")
}

async fn event_count(server: &TestServer, boundary: String) -> i64 {
    server
        .client()
        .admin
        .get_event_count(pb::GetEventCountRequest { boundary })
        .await
        .expect("count")
        .into_inner()
        .count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_run_every_scenario_and_report_what_the_server_did() {
    let transports = ["direct", "tonic"];
    let server = TestServer::start_with(|c| c.boundaries.extend(transports.map(boundary))).await;
    let dir = tempfile::tempdir().expect("temp dir");
    for transport in transports {
        let mut expected_events = SEED as i64;
        let report = run_bench(
            &server,
            transport,
            &dir.path().join(format!("{transport}.json")),
        );
        let rows = report.as_array().expect("rows");
        assert_eq!(rows.len(), 6, "{transport}: one row per scenario");
        for row in rows {
            let name = row["scenario"].as_str().expect("name");
            let requests = row["requests"].as_u64().expect("requests");
            let events = row["events"].as_u64().expect("events");
            assert!(requests > 0, "{transport} {name}: no requests");
            assert_eq!(row["errors"], 0, "{transport} {name}: {row}");
            match name {
                "write-conditional-1" | "write-conditional-100" => {
                    let per = row["events_per_request"].as_u64().expect("per request");
                    assert_eq!(events, requests * per, "{transport} {name}");
                    expected_events += events as i64;
                }
                // Every seeded context holds exactly 10 events.
                "read-conditional" => assert_eq!(events, requests * 10, "{transport} {name}"),
                "read-unconditional" => assert!(events >= requests, "{transport} {name}"),
                // Four seeded contexts per request, each found.
                "latest-by-criteria" => assert_eq!(events, requests * 4, "{transport} {name}"),
                "command-cycle" => expected_events += events as i64,
                other => panic!("unexpected scenario {other}"),
            }
        }
        // Measured writes are a lower bound: warm-up is off, but requests still in flight
        // when the clock stops are written and not counted.
        let stored = event_count(&server, boundary(transport)).await;
        assert!(
            stored >= expected_events,
            "{transport}: {stored} < {expected_events}"
        );
    }
}
