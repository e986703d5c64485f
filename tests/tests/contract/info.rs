use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn ping_and_server_info() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.es.ping(pb::PingRequest {}).await.expect("ping");
    let info =
        c.es.get_server_info(pb::GetServerInfoRequest {})
            .await
            .expect("info")
            .into_inner();
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert!(!info.git_commit.is_empty());
    assert!(!info.build_time.is_empty());
    assert_eq!(info.backend, pb::StorageBackend::Unspecified as i32);
    uuid::Uuid::parse_str(&info.node_id).expect("node_id is a UUID");
    let mut caps = info.capabilities.clone();
    caps.sort();
    assert_eq!(caps, vec![1, 2, 3, 4, 5], "all five capabilities");

    // A new process start gets a new node id.
    let dir = server.stop().await;
    let again = TestServer::start_in(dir, |_| {}).await;
    let info2 = again
        .client()
        .es
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_ne!(info2.node_id, info.node_id);
}

#[tokio::test]
async fn health_reports_serving_for_the_server_and_both_services() {
    let server = TestServer::start().await;
    let mut health = HealthClient::new(server.channel());
    for service in ["", "orisun.EventStore", "orisun.Admin"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .expect("check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_until_the_node_can_serve() {
    // Hold the node's data directory, as a previous instance still shutting down would:
    // the node listens, waits for the directory, and reports NOT_SERVING meanwhile.
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let holder = cairn_store::Store::open(data.join("db"), &cairn_store::StoreOptions::default())
        .expect("hold the directory");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = grpc.local_addr().expect("addr");
    let starting = tokio::spawn(cairn_server::start_on(
        cairn_server::ServeConfig::for_test(data),
        grpc,
        http,
    ));
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("the port is open while storage waits");
    let mut health = HealthClient::new(channel.clone());
    for _ in 0..3 {
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::NotServing as i32);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let early = pb::event_store_client::EventStoreClient::new(channel)
        .ping(pb::PingRequest {})
        .await
        .expect_err("not ready");
    assert_eq!(early.code(), tonic::Code::Unavailable);
    assert!(!starting.is_finished());

    drop(holder);
    let server = starting
        .await
        .expect("join")
        .expect("starts once the directory is free");
    let status = health
        .check(HealthCheckRequest {
            service: "orisun.EventStore".into(),
        })
        .await
        .expect("check")
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn http_probes_and_metrics() {
    let server = TestServer::start().await;
    let get = |path: &'static str| http_get(server.http_addr, path);
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
    let mut c = server.client();
    c.save("default", vec![event("T", "{}"), event("T", "{}")], vec![])
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
    let metrics = get("/metrics").await;
    assert!(
        metrics.contains("cairn_events_committed_total{boundary=\"default\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("cairn_writes_committed_total{boundary=\"default\"} 1"));
    assert!(metrics.contains("cairn_ccc_conflicts_total{boundary=\"default\"} 1"));
    assert!(metrics.contains(
        "cairn_grpc_requests_total{code=\"ALREADY_EXISTS\",method=\"orisun.EventStore/SaveEventsV2\"} 1"
    ));
    assert!(metrics.contains(
        "cairn_grpc_requests_total{code=\"OK\",method=\"orisun.EventStore/SaveEventsV2\"} 1"
    ));
}
