//! Server-side limits (docs/security.md): what a client, buggy or hostile, may hold of a
//! node, each refused with its documented status while the node keeps serving.

use std::time::Duration;

use cairn_tests::orisun as pb;
use cairn_tests::*;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

fn subscription(name: &str) -> pb::CatchUpSubscribeToEventStoreRequest {
    pb::CatchUpSubscribeToEventStoreRequest {
        after_position: None,
        query: None,
        subscriber_name: name.to_string(),
        boundary: "default".to_string(),
    }
}

async fn still_serving(server: &TestServer) {
    let mut c = server
        .new_connection(Credentials::basic(ADMIN.0, ADMIN.1))
        .await;
    c.es.ping(pb::PingRequest {}).await.expect("still serving");
    c.save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("and still writing");
}

#[tokio::test]
async fn subscriber_names_are_at_most_256_bytes() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let status =
        c.es.catch_up_subscribe_to_events(subscription(&"n".repeat(257)))
            .await
            .expect_err("257 bytes");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "subscriber_name is 257 bytes; the limit is 256"
    );
    c.es.catch_up_subscribe_to_events(subscription(&"n".repeat(256)))
        .await
        .expect("256 bytes");
}

#[tokio::test]
async fn a_user_holds_at_most_64_subscriptions_on_a_node() {
    let server = TestServer::start().await;
    server
        .create_user("reader", "reader-password", &["OPERATIONS"])
        .await;
    let mut reader = server.client_with(Credentials::basic("reader", "reader-password"));
    let mut open = Vec::new();
    for i in 0..64 {
        let stream = reader
            .es
            .catch_up_subscribe_to_events(subscription(&format!("s{i}")))
            .await
            .unwrap_or_else(|s| panic!("subscription {i}: {s:?}"))
            .into_inner();
        open.push(stream);
    }
    let status = reader
        .es
        .catch_up_subscribe_to_events(subscription("s64"))
        .await
        .expect_err("the 65th");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-subscriptions-per-user"),
        "{}",
        status.message()
    );
    // Another user is not affected, and the limit frees up as streams end.
    let mut admin = server.client();
    admin
        .es
        .catch_up_subscribe_to_events(subscription("admin-s"))
        .await
        .expect("another user's subscription");
    drop(open.pop());
    let mut reopened = None;
    for _ in 0..100 {
        match reader
            .es
            .catch_up_subscribe_to_events(subscription("s64"))
            .await
        {
            Ok(stream) => {
                reopened = Some(stream.into_inner());
                break;
            }
            // The server notices the closed stream when its task next looks.
            Err(s) if s.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("{s:?}"),
        }
    }
    let mut reopened = reopened.expect("a slot freed by a closed subscription");
    reader
        .save("default", vec![event("T", r#"{"n":1}"#)], vec![])
        .await
        .expect("write");
    let delivered = tokio::time::timeout(Duration::from_secs(10), reopened.next())
        .await
        .expect("delivered")
        .expect("open")
        .expect("event");
    assert_eq!(delivered.data, r#"{"n":1}"#);
}

#[tokio::test]
async fn events_larger_than_max_event_bytes_are_invalid_argument() {
    let server = TestServer::start_with(|c| c.max_event_bytes = 64 * 1024).await;
    let mut c = server.client();
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(64 * 1024));
    let status = c
        .save("default", vec![event("T", "{}"), event("T", &big)], vec![])
        .await
        .expect_err("too big");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("event 1 is ")
            && status.message().contains("--max-event-bytes"),
        "{}",
        status.message()
    );
    assert!(c.read_all("default").await.is_empty(), "nothing written");
    still_serving(&server).await;
}

/// Review H6: 20 events of 1 MiB come back in pages capped by bytes; paging on from the
/// last event read returns every one of them, in order, and a subscription delivers all.
#[tokio::test]
async fn large_events_come_back_in_byte_capped_pages() {
    const BUDGET: usize = 4 * 1024 * 1024;
    let server = TestServer::start_with(|c| c.max_response_bytes = BUDGET).await;
    let mut c = server.client();
    let payload = "y".repeat(1024 * 1024 - 64);
    for i in 0..20 {
        c.save(
            "default",
            vec![event("Big", &format!(r#"{{"i":{i},"p":"{payload}"}}"#))],
            vec![],
        )
        .await
        .expect("1 MiB event");
    }
    let mut from = None;
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = c
            .read("default", None, from, 10_000, pb::Direction::Asc)
            .await
            .expect("page");
        let bytes: usize = page.iter().map(|e| e.data.len()).sum();
        assert!(
            bytes < BUDGET + 1024 * 1024,
            "a page stops at the event that reaches the budget: {bytes}"
        );
        let Some(last) = page.last() else { break };
        let last_position = last.position.expect("position");
        pages += 1;
        for e in &page {
            let value: serde_json::Value = serde_json::from_str(&e.data).expect("json");
            seen.push(value["i"].as_i64().expect("i"));
        }
        // Continue strictly after the last event read (positions are (commit, prepare)).
        from = Some(pos(
            last_position.commit_position,
            last_position.prepare_position + 1,
        ));
        if pages > 40 {
            panic!("paging does not end");
        }
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    assert!(
        pages >= 4,
        "20 MiB in pages that stop at the event reaching 4 MiB: {pages}"
    );

    let mut stream =
        c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: Some(pos(0, 0)),
            ..subscription("big-reader")
        })
        .await
        .expect("subscribe")
        .into_inner();
    for want in 0..20 {
        let e = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("event in time")
            .expect("open")
            .expect("event");
        let value: serde_json::Value = serde_json::from_str(&e.data).expect("json");
        assert_eq!(value["i"].as_i64(), Some(want));
    }
}

/// One HTTP/2 frame: 9-byte header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const GOAWAY: u8 = 0x7;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Reads one frame: (kind, flags, stream, payload).
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    s: &mut R,
) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

/// Review H5: the client port announces 256 streams per connection, and a client that
/// opens streams past it (each refused) is sent GOAWAY (ENHANCE_YOUR_CALM) after 1,024
/// refusals instead of being refused forever. Other clients go on being served.
#[tokio::test]
async fn a_stream_flood_is_refused_then_sent_goaway() {
    let server = TestServer::start().await;
    let mut s = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    s.write_all(&frame(SETTINGS, 0, 0, &[]))
        .await
        .expect("settings");
    let mut max_streams = None;
    while max_streams.is_none() {
        let (kind, flags, _, payload) = read_frame(&mut s).await.expect("server settings");
        if kind == SETTINGS && flags & ACK == 0 {
            for setting in payload.chunks(6) {
                if setting[..2] == [0, 3] {
                    max_streams = Some(u32::from_be_bytes([
                        setting[2], setting[3], setting[4], setting[5],
                    ]));
                }
            }
            s.write_all(&frame(SETTINGS, ACK, 0, &[]))
                .await
                .expect("ack");
            max_streams.get_or_insert(u32::MAX);
        }
    }
    assert_eq!(max_streams, Some(256), "SETTINGS_MAX_CONCURRENT_STREAMS");
    // An authenticated Ping whose request body never comes: each stream stays open, so
    // streams past the 256th are refused. HPACK literals without indexing.
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    let mut literal = |name_index: &[u8], value: &[u8]| {
        block.extend_from_slice(name_index);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    };
    literal(&[0x04], b"/orisun.EventStore/Ping"); // :path (static index 4)
    literal(&[0x0f, 0x10], b"application/grpc"); // content-type (31)
    literal(&[0x0f, 0x08], b"Basic YWRtaW46Y2hhbmdlaXQ="); // authorization (23)
    let mut flood = Vec::new();
    for i in 0..1600u32 {
        flood.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &block));
    }
    let (mut reader, mut writer) = s.into_split();
    // Written while the replies are read, so neither side's buffers fill up.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&flood).await;
        writer
    });
    let goaway = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match read_frame(&mut reader).await {
                Ok((GOAWAY, _, _, payload)) => {
                    return Some(u32::from_be_bytes([
                        payload[4], payload[5], payload[6], payload[7],
                    ]));
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    })
    .await
    .expect("the server answers the flood within 30 s");
    assert_eq!(goaway, Some(ENHANCE_YOUR_CALM), "GOAWAY(ENHANCE_YOUR_CALM)");
    drop(writing.await);
    still_serving(&server).await;
}

/// The HTTP port closes a connection whose request headers do not arrive in time (a slow
/// client cannot hold its connections open), and it refuses connections beyond its cap.
#[tokio::test]
async fn the_http_port_times_out_slow_headers_and_caps_connections() {
    let server = TestServer::start_with(|c| {
        c.connection_limits.http_header_read_timeout = Duration::from_secs(1);
        c.connection_limits.max_http_connections = 4;
    })
    .await;
    let mut slow = tokio::net::TcpStream::connect(server.http_addr)
        .await
        .expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("partial headers");
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "the server closed a connection that never finished its headers"
    );
    drop(slow);

    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(server.http_addr)
            .await
            .expect("connect");
        // A complete request keeps the connection (keep-alive) and its slot.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        let mut reply = [0u8; 12];
        s.read_exact(&mut reply).await.expect("answered");
        assert_eq!(&reply, b"HTTP/1.1 200");
        held.push(s);
    }
    let mut refused = tokio::net::TcpStream::connect(server.http_addr)
        .await
        .expect("the kernel accepts it");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut rest))
        .await
        .expect("closed at once");
    assert!(
        read.is_err() || rest.is_empty(),
        "the fifth connection is closed without an answer"
    );
    drop(held);
    let metrics = loop {
        // Slots free up as the closed connections' tasks end.
        let text = tokio::time::timeout(
            Duration::from_secs(5),
            http_get(server.http_addr, "/metrics"),
        )
        .await;
        if let Ok(text) = text
            && text.starts_with("HTTP/1.1 200")
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        metrics.contains("cairn_connections_refused_total{port=\"http\"} 1"),
        "{metrics}"
    );
}

/// Review H5: beyond --max-connections a client connection is closed at once, and the
/// connections already open go on being served.
#[tokio::test]
async fn the_client_port_caps_connections() {
    let server = TestServer::start_with(|c| c.connection_limits.max_connections = 8).await;
    // The harness holds one connection of its own.
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(
            server
                .new_connection(Credentials::basic(ADMIN.0, ADMIN.1))
                .await,
        );
    }
    for c in &mut held {
        c.es.ping(pb::PingRequest {}).await.expect("within the cap");
    }
    let mut beyond = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("the kernel accepts it");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), beyond.read_to_end(&mut rest))
        .await
        .expect("closed at once");
    assert!(read.is_err() || rest.is_empty(), "closed without a byte");
    server
        .client()
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("the open connections are still served");
    drop(held);
}
