use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

async fn count(c: &mut Client) -> usize {
    c.read_all("default").await.len()
}

#[tokio::test]
async fn e1_events_type_and_id_are_required() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let empty = c
        .save("default", vec![], vec![])
        .await
        .expect_err("no events");
    assert_eq!(empty.code(), Code::InvalidArgument);
    let mut no_type = event("", "{}");
    no_type.event_type.clear();
    let status = c
        .save("default", vec![event("T", "{}"), no_type], vec![])
        .await
        .expect_err("no type");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("event 1"), "{}", status.message());
    let mut no_id = event("T", "{}");
    no_id.event_id.clear();
    let status = c
        .save("default", vec![no_id], vec![])
        .await
        .expect_err("no id");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(count(&mut c).await, 0, "nothing was written");
    let mut any_id = event("T", "{}");
    any_id.event_id = "not-a-uuid at all".into();
    c.save("default", vec![any_id], vec![])
        .await
        .expect("any non-empty id");
}

#[tokio::test]
async fn e2_data_and_metadata_must_be_json_objects() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for (data, stored) in [
        ("", "{}"),
        ("null", "{}"),
        ("{}", "{}"),
        (r#"{"a":1}"#, r#"{"a":1}"#),
    ] {
        let mut e = event("T", data);
        e.metadata = data.to_string();
        c.save("default", vec![e], vec![]).await.expect("accepted");
        let last = c
            .read("default", None, None, 1, pb::Direction::Desc)
            .await
            .expect("read");
        assert_eq!(last[0].data, stored);
        assert_eq!(last[0].metadata, stored);
    }
    for bad in ["[]", "\"text\"", "42", "true", "{", "{\"a\":}", "{} {}"] {
        let status = c
            .save("default", vec![event("T", "{}"), event("T", bad)], vec![])
            .await
            .expect_err("not an object");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
        assert!(
            status.message().starts_with("event 1 data"),
            "{bad}: {}",
            status.message()
        );
        let mut e = event("T", "{}");
        e.metadata = bad.to_string();
        let status = c
            .save("default", vec![e], vec![])
            .await
            .expect_err("metadata");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("event 0 metadata"),
            "{}",
            status.message()
        );
    }
    assert_eq!(count(&mut c).await, 4);
}

#[tokio::test]
async fn e2_numbers_round_trip_exactly() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let data = r#"{"max":9223372036854775807,"unsafe":9007199254740993,"precise":0.12345678901234567890123456789,"neg":-0.5}"#;
    let mut e = event("Numbers", data);
    e.metadata = r#"{"big":123456789012345678901234567890}"#.into();
    c.save("default", vec![e], vec![]).await.expect("saved");
    let stored = &c.read_all("default").await[0];
    assert_eq!(stored.data, data);
    assert_eq!(stored.metadata, r#"{"big":123456789012345678901234567890}"#);
}

#[tokio::test]
async fn e3_event_type_is_canonical_in_data_and_omitted_on_read() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save(
        "default",
        vec![event(
            "AccountOpened",
            r#"{"eventType":"Spoofed","id":"a1"}"#,
        )],
        vec![],
    )
    .await
    .expect("saved");
    let stored = &c.read_all("default").await[0];
    assert_eq!(stored.event_type, "AccountOpened");
    assert_eq!(
        stored.data, r#"{"id":"a1"}"#,
        "eventType is not in returned data"
    );
    let by_type = c
        .read(
            "default",
            Some(query(vec![criterion(&[("eventType", "AccountOpened")])])),
            None,
            10,
            pb::Direction::Asc,
        )
        .await
        .expect("read");
    assert_eq!(by_type.len(), 1);
    let spoofed = c
        .read(
            "default",
            Some(query(vec![criterion(&[("eventType", "Spoofed")])])),
            None,
            10,
            pb::Direction::Asc,
        )
        .await
        .expect("read");
    assert!(
        spoofed.is_empty(),
        "the request's event_type overwrote the app key"
    );
}

#[tokio::test]
async fn e4_event_ids_are_not_deduplicated() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let e = event("T", "{}");
    c.save("default", vec![e.clone()], vec![])
        .await
        .expect("first");
    c.save("default", vec![e.clone(), e.clone()], vec![])
        .await
        .expect("again");
    let all = c.read_all("default").await;
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|x| x.event_id == e.event_id));
}
