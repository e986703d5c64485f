use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

async fn matching(c: &mut Client, q: pb::Query) -> Vec<i64> {
    c.read("default", Some(q), None, 100, pb::Direction::Asc)
        .await
        .expect("read")
        .iter()
        .map(|e| pair(&e.position).1)
        .collect()
}

#[tokio::test]
async fn q1_queries_are_or_of_and() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for data in [
        r#"{"a":"1","b":"1"}"#,
        r#"{"a":"1","b":"2"}"#,
        r#"{"a":"2","b":"1"}"#,
    ] {
        c.save("default", vec![event("T", data)], vec![])
            .await
            .expect("write");
    }
    assert_eq!(
        matching(&mut c, query(vec![criterion(&[("a", "1"), ("b", "1")])])).await,
        vec![0]
    );
    assert_eq!(
        matching(
            &mut c,
            query(vec![
                criterion(&[("a", "1"), ("b", "2")]),
                criterion(&[("a", "2")])
            ])
        )
        .await,
        vec![1, 2]
    );
    assert_eq!(
        matching(&mut c, query(vec![criterion(&[("a", "1")])])).await,
        vec![0, 1]
    );
    assert_eq!(
        matching(&mut c, query(vec![])).await,
        vec![0, 1, 2],
        "zero criteria match all"
    );
    let all = c
        .read("default", None, None, 100, pb::Direction::Asc)
        .await
        .expect("read");
    assert_eq!(all.len(), 3, "no query matches all");
}

#[tokio::test]
async fn q2_keys_are_literal_top_level_keys() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save(
        "default",
        vec![event("T", r#"{"scopes.accountOpenedId":"acc-1"}"#)],
        vec![],
    )
    .await
    .expect("flat");
    c.save(
        "default",
        vec![event("T", r#"{"scopes":{"accountOpenedId":"acc-1"}}"#)],
        vec![],
    )
    .await
    .expect("nested");
    assert_eq!(
        matching(
            &mut c,
            query(vec![criterion(&[("scopes.accountOpenedId", "acc-1")])])
        )
        .await,
        vec![0]
    );
}

#[tokio::test]
async fn q3_scalars_match_by_text() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let datas = [
        r#"{"v":42}"#,
        r#"{"v":"42"}"#,
        r#"{"v":1e10}"#,
        r#"{"v":true}"#,
        r#"{"v":null}"#,
        r#"{"v":{"x":1}}"#,
        r#"{"v":[42]}"#,
        r#"{"w":42}"#,
        r#"{"v":"true"}"#,
        r#"{"v":1.50}"#,
    ];
    for d in datas {
        c.save("default", vec![event("T", d)], vec![])
            .await
            .expect("write");
    }
    let m = |v: &str| query(vec![criterion(&[("v", v)])]);
    assert_eq!(matching(&mut c, m("42")).await, vec![0, 1]);
    assert_eq!(matching(&mut c, m("10000000000")).await, vec![2]);
    assert_eq!(matching(&mut c, m("true")).await, vec![3, 8]);
    assert_eq!(matching(&mut c, m("1.50")).await, vec![9]);
    for never in ["null", "", "{\"x\":1}", "[42]", "1e10"] {
        assert!(matching(&mut c, m(never)).await.is_empty(), "{never}");
    }
}

#[tokio::test]
async fn q4_empty_keys_and_nul_are_invalid() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for tags in [vec![("", "x")], vec![("a\0b", "x")], vec![("a", "x\0")]] {
        let q = query(vec![criterion(&tags)]);
        let status = c
            .read("default", Some(q.clone()), None, 10, pb::Direction::Asc)
            .await
            .expect_err("read");
        assert_eq!(status.code(), Code::InvalidArgument, "{tags:?}");
        let status = c
            .latest("default", q.criteria.clone())
            .await
            .expect_err("latest");
        assert_eq!(status.code(), Code::InvalidArgument);
        let status = c
            .save(
                "default",
                vec![event("T", "{}")],
                vec![observe(q, none_pos())],
            )
            .await
            .expect_err("observation");
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    assert!(c.read_all("default").await.is_empty());
}

#[tokio::test]
async fn long_values_and_keys_match_exactly() {
    // Parts over 64 bytes are indexed by digest: matching must stay exact, including for
    // values that share a long prefix and for a CCC check on such a value.
    let server = TestServer::start().await;
    let mut c = server.client();
    let long_a = "x".repeat(200);
    let long_b = format!("{}y", "x".repeat(199));
    let at_limit = "z".repeat(64);
    let long_key = "k".repeat(100);
    for d in [
        format!(r#"{{"v":"{long_a}"}}"#),
        format!(r#"{{"v":"{long_b}"}}"#),
        format!(r#"{{"v":"{at_limit}"}}"#),
        format!(r#"{{"{long_key}":"{long_a}"}}"#),
    ] {
        c.save("default", vec![event("T", &d)], vec![])
            .await
            .expect("write");
    }
    let m = |k: &str, v: &str| query(vec![criterion(&[(k, v)])]);
    assert_eq!(matching(&mut c, m("v", &long_a)).await, vec![0]);
    assert_eq!(matching(&mut c, m("v", &long_b)).await, vec![1]);
    assert_eq!(matching(&mut c, m("v", &at_limit)).await, vec![2]);
    assert_eq!(matching(&mut c, m(&long_key, &long_a)).await, vec![3]);
    assert!(matching(&mut c, m("v", &"x".repeat(201))).await.is_empty());
    assert!(matching(&mut c, m(&long_key, &long_b)).await.is_empty());

    // The CCC check sees the long value's posting list: a stale observation conflicts.
    let stale = c
        .save(
            "default",
            vec![event("T", r#"{"n":1}"#)],
            vec![observe(
                m("v", &long_a),
                pb::Position {
                    commit_position: -1,
                    prepare_position: -1,
                },
            )],
        )
        .await
        .expect_err("the long value already has an event");
    assert_eq!(stale.code(), Code::AlreadyExists);
}
