//! Bad input never panics the server: each case gets a precise status and the server keeps
//! serving.

use bytes_helper::*;
use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

/// Hand-rolled protobuf encoding, to send bytes no well-behaved client would.
mod bytes_helper {
    pub fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn field_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
        varint(u64::from(field << 3 | 2), out);
        varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
}

/// Sends raw bytes as a unary request and decodes nothing: only the status matters.
async fn raw_unary(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    #[derive(Default, Clone)]
    struct Raw;
    struct RawEnc;
    struct RawDec;
    impl Encoder for RawEnc {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            use bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl Decoder for RawDec {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
            use bytes::Buf;
            Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
        }
    }
    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawEnc;
        type Decoder = RawDec;
        fn encoder(&mut self) -> RawEnc {
            RawEnc
        }
        fn decoder(&mut self) -> RawDec {
            RawDec
        }
    }
    let mut grpc = tonic::client::Grpc::new(server.channel());
    grpc.ready().await.expect("ready");
    let mut request = tonic::Request::new(body);
    request.metadata_mut().insert(
        "authorization",
        "Basic YWRtaW46Y2hhbmdlaXQ=".parse().expect("header"),
    );
    match grpc
        .unary(request, http::uri::PathAndQuery::from_static(path), Raw)
        .await
    {
        Ok(_) => tonic::Status::ok("accepted"),
        Err(status) => status,
    }
}

async fn still_serving(server: &TestServer) {
    let mut c = server.client();
    c.es.ping(pb::PingRequest {})
        .await
        .expect("server still serves");
    c.save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("and writes");
}

#[tokio::test]
async fn malformed_protobuf_is_invalid_argument() {
    let server = TestServer::start().await;
    for garbage in [
        vec![0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0x0a, 0x50, 0x01],
        vec![0x12; 7],
        vec![0x08],
    ] {
        let status = raw_unary(&server, "/orisun.EventStore/SaveEventsV2", garbage.clone()).await;
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{garbage:?}: {status:?}"
        );
        let status = raw_unary(&server, "/orisun.EventStore/GetEvents", garbage.clone()).await;
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{garbage:?}: {status:?}"
        );
    }
    still_serving(&server).await;
    assert_eq!(
        server.client().read_all("default").await.len(),
        1,
        "garbage wrote nothing"
    );
}

#[tokio::test]
async fn invalid_utf8_in_json_is_invalid_argument() {
    let server = TestServer::start().await;
    let mut event = Vec::new();
    field_bytes(1, b"id-1", &mut event);
    field_bytes(2, b"T", &mut event);
    field_bytes(3, b"{\"a\":\"\xff\xfe\"}", &mut event);
    let mut request = Vec::new();
    field_bytes(1, b"default", &mut request);
    field_bytes(2, &event, &mut request);
    let status = raw_unary(&server, "/orisun.EventStore/SaveEventsV2", request).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    still_serving(&server).await;
}

#[tokio::test]
async fn oversized_messages_are_refused() {
    let server = TestServer::start_with(|c| c.max_message_bytes = 1024 * 1024).await;
    let mut c = server.client();
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(2 * 1024 * 1024));
    let status = c
        .save("default", vec![event("T", &big)], vec![])
        .await
        .expect_err("too big");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("too large"),
        "{}",
        status.message()
    );
    still_serving(&server).await;
}

#[tokio::test]
async fn deep_json_nesting_is_invalid_argument() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for depth in [129, 10_000, 100_000] {
        let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
        let status = c
            .save("default", vec![event("T", &deep)], vec![])
            .await
            .expect_err("deep");
        assert_eq!(status.code(), Code::InvalidArgument, "{depth}");
        assert!(
            status.message().contains("recursion limit"),
            "{}",
            status.message()
        );
    }
    let ok = format!(r#"{{"a":{}1{}}}"#, "[".repeat(100), "]".repeat(100));
    c.save("default", vec![event("T", &ok)], vec![])
        .await
        .expect("100 levels are fine");
    still_serving(&server).await;
}

/// serde_json reads an object whose first key is one of its private markers as a number or
/// a raw value (found by the json_canonical fuzz target): such payloads are refused whole,
/// nested or not, rather than stored altered.
#[tokio::test]
async fn serde_json_private_markers_are_invalid_argument_and_store_nothing() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for data in [
        r#"{"$serde_json::private::Number":"12"}"#,
        r#"{"a":{"$serde_json::private::Number":"12"},"b":1}"#,
        r#"{"\u0024serde_json::private::RawValue":-5}"#,
    ] {
        let status = c
            .save("default", vec![event("T", data)], vec![])
            .await
            .expect_err(data);
        assert_eq!(status.code(), Code::InvalidArgument, "{data}");
        assert!(
            status.message().contains("reserves"),
            "{}",
            status.message()
        );
    }
    let stored = c
        .read("default", None, None, 10, pb::Direction::Asc)
        .await
        .expect("read");
    assert!(stored.is_empty(), "nothing was stored: {stored:?}");
    still_serving(&server).await;
}

#[tokio::test]
async fn ten_thousand_criterion_queries_are_invalid_argument() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let huge: Vec<pb::Criterion> = (0..10_000)
        .map(|i| criterion(&[("k", &i.to_string())]))
        .collect();
    let q = query(huge.clone());
    let status = c
        .read("default", Some(q.clone()), None, 10, pb::Direction::Asc)
        .await
        .expect_err("read");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "query has 10000 criteria; the limit is 4096"
    );
    let status = c.latest("default", huge).await.expect_err("latest");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = c
        .save(
            "default",
            vec![event("T", "{}")],
            vec![observe(q.clone(), none_pos())],
        )
        .await
        .expect_err("observation");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status =
        c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: None,
            query: Some(q),
            subscriber_name: "s".into(),
            boundary: "default".into(),
        })
        .await
        .expect_err("subscription");
    assert_eq!(status.code(), Code::InvalidArgument);
    // At the limit it is served (from the index, not by scanning).
    for i in 0..10 {
        c.save(
            "default",
            vec![event("T", &format!(r#"{{"k":"{}"}}"#, i * 400))],
            vec![],
        )
        .await
        .expect("w");
    }
    let at_limit = query(
        (0..4096)
            .map(|i| criterion(&[("k", &i.to_string())]))
            .collect(),
    );
    let found = c
        .read("default", Some(at_limit), None, 100, pb::Direction::Asc)
        .await
        .expect("4096 criteria");
    assert_eq!(found.len(), 10);
    still_serving(&server).await;
}

/// Review C1: exponents at the ends of i64 once wrapped past the expansion guard in builds
/// without overflow checks and aborted the process. Each is stored with its literal text,
/// indexed by it, and the node keeps serving.
#[tokio::test]
async fn extreme_number_exponents_are_stored_and_matched_by_their_literal() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let literals = [
        "1e+9223372036854775807",
        "1e9223372036854775807",
        "1e-9223372036854775808",
        "0.5e+9223372036854775807",
        "-7.25E-9223372036854775807",
        "1e99999999999999999999",
    ];
    for literal in literals {
        let data = format!(r#"{{"n":{literal},"k":"exp"}}"#);
        c.save("default", vec![event("Num", &data)], vec![])
            .await
            .unwrap_or_else(|s| panic!("{literal}: {s:?}"));
    }
    let stored = c.read_all("default").await;
    assert_eq!(stored.len(), literals.len());
    let spelling = |t: &str| t.to_ascii_lowercase().replace("e+", "e");
    for (literal, event) in literals.iter().zip(&stored) {
        let value: serde_json::Value = serde_json::from_str(&event.data).expect("stored JSON");
        // Stored as serde_json spells it (`e+` for a positive exponent), the value unchanged.
        let stored_literal = value["n"].to_string();
        assert_eq!(spelling(&stored_literal), spelling(literal));
        let same_value = literals
            .iter()
            .filter(|l| spelling(l) == spelling(literal))
            .count();
        let found = c
            .read(
                "default",
                Some(query(vec![criterion(&[("n", &stored_literal)])])),
                None,
                10,
                pb::Direction::Asc,
            )
            .await
            .expect("read by the literal");
        assert_eq!(
            found.len(),
            same_value,
            "{literal} is indexed by its literal text"
        );
    }
    still_serving(&server).await;
}

/// Write ids and positions at the ends of i64 are answered, never overflowed (review: the
/// write-context lookup computed `prepare + 1`).
#[tokio::test]
async fn edge_write_ids_and_positions_are_answered() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("one event");
    let max = i64::MAX.to_string();
    for (write_id, want) in [
        (format!("0:{max}"), Code::NotFound),
        (format!("{max}:{max}"), Code::NotFound),
        (format!("{max}:0"), Code::NotFound),
        (format!("{max}:9223372036854775806"), Code::NotFound),
        ("9223372036854775808:0".to_string(), Code::InvalidArgument),
        ("0:9223372036854775808".to_string(), Code::InvalidArgument),
        ("-1:0".to_string(), Code::InvalidArgument),
    ] {
        let status =
            c.es.get_write_context(pb::GetWriteContextRequest {
                boundary: "default".into(),
                write_id: write_id.clone(),
            })
            .await
            .expect_err("no such write");
        assert_eq!(status.code(), want, "{write_id}: {status:?}");
    }
    for (commit, prepare) in [
        (i64::MAX, i64::MAX),
        (i64::MAX, 0),
        (1, i64::MAX),
        (i64::MIN, i64::MIN),
        (0, i64::MIN),
        (i64::MAX, i64::MIN),
    ] {
        for direction in [pb::Direction::Asc, pb::Direction::Desc] {
            let page = c
                .read("default", None, Some(pos(commit, prepare)), 10, direction)
                .await;
            assert!(
                page.is_ok() || matches!(&page, Err(s) if s.code() == Code::InvalidArgument),
                "({commit}, {prepare}) {direction:?}: {page:?}"
            );
        }
    }
    let page = c
        .read(
            "default",
            None,
            Some(pos(i64::MAX, i64::MAX)),
            10,
            pb::Direction::Desc,
        )
        .await
        .expect("DESC from past the end");
    assert_eq!(page.len(), 1);
    still_serving(&server).await;
}
