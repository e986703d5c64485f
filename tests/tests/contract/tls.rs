//! TLS of the client and HTTP ports (beyond the Orisun contract: `docs/security.md`): a
//! real rustls server with certificates from a throwaway CA, tonic and cairn-client as the
//! clients, certificate files rewritten under a running server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_server::ServeConfig;
use cairn_server::tls::{TlsConfig, TlsFiles, TlsRole};
use cairn_tests::orisun as pb;
use cairn_tests::pki::{Leaf, Pki};
use cairn_tests::*;
use futures::StreamExt;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Well below the default so a renewal test takes a moment, not ten seconds.
const RELOAD: Duration = Duration::from_millis(100);

fn serve_tls(leaf: &Leaf, client_ca: Option<&Pki>, http: bool) -> impl FnOnce(&mut ServeConfig) {
    let files = TlsFiles {
        role: TlsRole::Client,
        cert: leaf.cert_file.clone(),
        key: leaf.key_file.clone(),
        client_ca: client_ca.map(|ca| ca.ca_file.clone()),
    };
    move |config| {
        config.tls = Some(TlsConfig {
            files,
            http,
            reload_interval: RELOAD,
            handshake_timeout: Duration::from_secs(10),
        });
    }
}

/// A server on `leaf` (client certificates of `client_ca` required, when given), its
/// clients connecting with `client`.
async fn start_tls(
    client: ClientTlsConfig,
    leaf: &Leaf,
    client_ca: Option<&Pki>,
    http: bool,
) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    TestServer::start_over(dir, Some(client), serve_tls(leaf, client_ca, http)).await
}

/// A server that requires client certificates of `clients`; its test clients present
/// `app`'s.
struct MutualTls {
    server: TestServer,
    ca: Pki,
    /// Holds the client CA's file for the server's reloads.
    clients: Pki,
    app: Leaf,
}

impl MutualTls {
    async fn start() -> MutualTls {
        let ca = Pki::new("cluster");
        let clients = Pki::new("clients");
        let leaf = ca.server("node", 90);
        let app = clients.client("app", 30);
        let server = start_tls(presenting(&ca, &app), &leaf, Some(&clients), false).await;
        MutualTls {
            server,
            ca,
            clients,
            app,
        }
    }
}

fn trusting(ca: &Pki) -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.ca_pem))
}

fn presenting(ca: &Pki, identity: &Leaf) -> ClientTlsConfig {
    trusting(ca).identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem))
}

/// Whether a ping over a new connection with `tls` succeeds. With TLS 1.3 a refused client
/// certificate surfaces after the client's side of the handshake, at the first call, so
/// both steps count.
async fn ping_over(
    addr: std::net::SocketAddr,
    tls: Option<&ClientTlsConfig>,
) -> Result<(), String> {
    let channel = connect(addr, tls)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut es = pb::event_store_client::EventStoreClient::with_interceptor(
        channel,
        Credentials::basic(ADMIN.0, ADMIN.1),
    );
    match es.ping(pb::PingRequest {}).await {
        Ok(_) => Ok(()),
        Err(status) => Err(format!("ping: {status}")),
    }
}

/// The value of the exposition line that starts with `series` (name and labels).
fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Polls /metrics until `series` satisfies `done` (a reload is asynchronous by design).
async fn wait_for_metric(
    http: std::net::SocketAddr,
    series: &str,
    done: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let exposition = http_get(http, "/metrics").await;
        if let Some(value) = metric(&exposition, series).filter(|v| done(*v)) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never as expected:\n{exposition}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const SERVING_EXPIRY: &str =
    "cairn_tls_certificate_expiry_timestamp_seconds{certificate=\"serving\"}";

#[tokio::test]
async fn the_client_port_speaks_tls_only_once_it_has_a_certificate() {
    let ca = Pki::new("cluster");
    let leaf = ca.server("node", 90);
    let server = start_tls(trusting(&ca), &leaf, None, false).await;

    let mut c = server.client();
    c.save("default", vec![event("T", r#"{"n":1}"#)], vec![])
        .await
        .expect("write over TLS");
    assert_eq!(c.read_all("default").await.len(), 1);

    let plaintext = ping_over(server.addr, None).await;
    assert!(plaintext.is_err(), "a plaintext client was served");
    let stranger = Pki::new("stranger");
    let untrusted = ping_over(server.addr, Some(&trusting(&stranger))).await;
    assert!(untrusted.is_err(), "a client trusting another CA connected");

    // Probes stay plaintext without --http-tls; the metrics tell what happened.
    let exposition = http_get(server.http_addr, "/metrics").await;
    assert!(exposition.starts_with("HTTP/1.1 200"), "{exposition}");
    assert_eq!(
        metric(&exposition, SERVING_EXPIRY),
        Some(leaf.not_after as f64),
        "{exposition}"
    );
    let failures = metric(
        &exposition,
        "cairn_tls_handshake_failures_total{port=\"client\"}",
    )
    .expect("handshake failures exported");
    assert!(
        failures >= 1.0,
        "the plaintext client's handshake was not counted"
    );
}

#[tokio::test]
async fn mutual_tls_admits_certificates_of_the_client_ca_and_still_asks_for_a_password() {
    let MutualTls {
        server,
        ca,
        clients: _clients,
        app: _,
    } = MutualTls::start().await;

    let mut c = server.client();
    c.save("default", vec![event("T", r#"{"n":1}"#)], vec![])
        .await
        .expect("write with a client certificate");
    let mut anonymous = server.client_with(Credentials::none());
    let refused = anonymous
        .save("default", vec![event("T", r#"{"n":2}"#)], vec![])
        .await
        .expect_err("a certificate alone is no login");
    assert_eq!(refused.code(), Code::Unauthenticated);

    assert!(
        ping_over(server.addr, Some(&trusting(&ca))).await.is_err(),
        "a client without a certificate was served"
    );
    let forged = ca.client("app", 30);
    assert!(
        ping_over(server.addr, Some(&presenting(&ca, &forged)))
            .await
            .is_err(),
        "a certificate of another CA was accepted"
    );
    assert_eq!(c.read_all("default").await.len(), 1);
}

#[tokio::test]
async fn renewed_certificates_reach_new_connections_while_open_ones_keep_streaming() {
    let old_ca = Pki::new("old");
    let new_ca = Pki::new("new");
    let leaf = old_ca.server("node", 90);
    let server = start_tls(trusting(&old_ca), &leaf, None, false).await;
    let mut c = server.client();
    c.save("default", vec![event("T", r#"{"n":1}"#)], vec![])
        .await
        .expect("first write");
    let mut stream =
        c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: None,
            query: None,
            subscriber_name: "renewal".into(),
            boundary: "default".into(),
        })
        .await
        .expect("subscribe")
        .into_inner();
    next_event(&mut stream).await;

    // What cert-manager does: new key and certificate, here from another CA, so which
    // certificate a connection got is visible to the client.
    let renewed = new_ca.server("renewed", 60);
    std::fs::write(&leaf.key_file, &renewed.key_pem).expect("write key");
    std::fs::write(&leaf.cert_file, &renewed.cert_pem).expect("write certificate");
    wait_for_metric(server.http_addr, SERVING_EXPIRY, |v| {
        v == renewed.not_after as f64
    })
    .await;

    ping_over(server.addr, Some(&trusting(&new_ca)))
        .await
        .expect("a new connection gets the renewed certificate");
    assert!(
        ping_over(server.addr, Some(&trusting(&old_ca)))
            .await
            .is_err(),
        "a new connection still got the old certificate"
    );
    // The open connection (trusting only the old CA) was not dropped: it still writes,
    // and its subscription sees the write.
    c.save("default", vec![event("T", r#"{"n":2}"#)], vec![])
        .await
        .expect("write on the connection opened before the renewal");
    assert_eq!(next_event(&mut stream).await.data, r#"{"n":2}"#);

    // A broken renewal is reported and the last good certificate stays in use.
    let failed = "cairn_tls_reloads_total{result=\"failed\"}";
    std::fs::write(&leaf.cert_file, "not a certificate").expect("break the file");
    wait_for_metric(server.http_addr, failed, |v| v >= 1.0).await;
    ping_over(server.addr, Some(&trusting(&new_ca)))
        .await
        .expect("the last good certificate is still served");
}

async fn next_event(stream: &mut tonic::codec::Streaming<pb::Event>) -> pb::Event {
    tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("event within 30 s")
        .expect("stream open")
        .expect("event")
}

#[tokio::test]
async fn the_http_port_serves_tls_with_http_tls() {
    let ca = Pki::new("cluster");
    let leaf = ca.server("node", 90);
    let server = start_tls(trusting(&ca), &leaf, None, true).await;

    let response = https_get(server.http_addr, &ca, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("cairn_tls_certificate_expiry_timestamp_seconds"));
    let ready = https_get(server.http_addr, &ca, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");

    let plain = plain_http_get(server.http_addr, "/metrics").await;
    assert!(
        !plain.contains("200 OK"),
        "plaintext HTTP was served: {plain}"
    );
}

#[tokio::test]
async fn unusable_tls_files_stop_the_start_with_the_flag_named() {
    let ca = Pki::new("cluster");
    let leaf = ca.server("node", 90);
    let other = ca.server("other", 90);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ServeConfig::for_test(dir.path().join("data"));
    serve_tls(
        &Leaf {
            key_file: other.key_file.clone(),
            ..leaf.clone()
        },
        None,
        false,
    )(&mut config);
    let Err(error) = cairn_server::start(config).await else {
        panic!("a key of another certificate was accepted");
    };
    assert!(error.to_string().contains("--tls-key"), "{error}");
}

#[tokio::test]
async fn cairn_client_connects_with_a_ca_and_a_client_certificate() {
    let MutualTls {
        server,
        ca,
        clients: _clients,
        app,
    } = MutualTls::start().await;
    let config = cairn_client::ClientConfig::new([format!("https://{}", server.addr)])
        .credentials(ADMIN.0, ADMIN.1)
        .tls_ca_certificate(ca.ca_pem.clone());
    let without_identity = cairn_client::Client::new(config.clone()).expect("client");
    assert!(without_identity.ping().await.is_err());
    let client = cairn_client::Client::new(
        config.tls_client_identity(app.cert_pem.clone(), app.key_pem.clone()),
    )
    .expect("client");
    client.ping().await.expect("ping over mutual TLS");

    let plain = cairn_client::ClientConfig::new([format!("http://{}", server.addr)])
        .tls_ca_certificate(ca.ca_pem.clone());
    let Err(refused) = cairn_client::Client::new(plain) else {
        panic!("TLS files with an http:// endpoint were accepted");
    };
    assert!(
        refused.to_string().contains("not an https:// endpoint"),
        "{refused}"
    );
}

/// `GET path` over TLS trusting `ca`; the whole response.
async fn https_get(addr: std::net::SocketAddr, ca: &Pki, path: &str) -> String {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(ca.ca_pem.as_bytes()).expect("CA"))
        .expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    // A server may close without close_notify after `Connection: close`; what arrived counts.
    let _ = tls.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path` in plaintext, tolerating a server that hangs up.
async fn plain_http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = s
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
