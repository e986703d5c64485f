use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

fn account(id: &str) -> pb::Query {
    query(vec![criterion(&[("accountId", id)])])
}

async fn assert_nothing_written(c: &mut Client, expected: usize) {
    assert_eq!(
        c.read_all("default").await.len(),
        expected,
        "a rejected write changed nothing"
    );
}

#[tokio::test]
async fn c1_observation_limits_and_shape_are_validated() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let e = || vec![event("T", "{}")];
    let many_obs: Vec<_> = (0..1025)
        .map(|i| observe(query(vec![criterion(&[("k", &i.to_string())])]), none_pos()))
        .collect();
    let many_criteria = observe(
        query(
            (0..4097)
                .map(|i| criterion(&[("k", &i.to_string())]))
                .collect(),
        ),
        none_pos(),
    );
    // 9 criteria of 1900 tags: 17,100 tags in total.
    let many_tags: Vec<_> = (0..9)
        .map(|o| {
            let tags = (0..1900)
                .map(|t| pb::Tag {
                    key: format!("t{t}"),
                    value: o.to_string(),
                })
                .collect();
            observe(query(vec![pb::Criterion { tags }]), none_pos())
        })
        .collect();
    let cases: Vec<(&str, Vec<pb::ConsistencyObservation>)> = vec![
        ("1025 observations", many_obs),
        ("4097 criteria", vec![many_criteria]),
        ("> 16384 tags", many_tags),
        ("no criteria", vec![observe(query(vec![]), none_pos())]),
        (
            "no query",
            vec![pb::ConsistencyObservation {
                query: None,
                position: Some(none_pos()),
            }],
        ),
        (
            "criterion without tags",
            vec![observe(query(vec![criterion(&[])]), none_pos())],
        ),
        (
            "empty key",
            vec![observe(query(vec![criterion(&[("", "v")])]), none_pos())],
        ),
        (
            "half-negative position",
            vec![observe(account("a"), pos(-1, 5))],
        ),
        (
            "negative position",
            vec![observe(account("a"), pos(-2, -2))],
        ),
        (
            "missing position",
            vec![pb::ConsistencyObservation {
                query: Some(account("a")),
                position: None,
            }],
        ),
        (
            "key with two values",
            vec![observe(
                query(vec![criterion(&[("a", "1"), ("a", "2")])]),
                none_pos(),
            )],
        ),
        (
            "same query at two positions",
            vec![
                observe(
                    query(vec![criterion(&[("a", "1"), ("b", "2")])]),
                    none_pos(),
                ),
                observe(query(vec![criterion(&[("b", "2"), ("a", "1")])]), pos(1, 0)),
            ],
        ),
    ];
    for (what, consistency) in cases {
        let status = c.save("default", e(), consistency).await.expect_err(what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
    }
    assert_nothing_written(&mut c, 0).await;

    // At the limits, and with duplicates that normalise away, the write is accepted.
    let at_limit: Vec<_> = (0..1024)
        .map(|i| observe(query(vec![criterion(&[("k", &i.to_string())])]), none_pos()))
        .collect();
    c.save("default", e(), at_limit)
        .await
        .expect("1024 observations");
    let merged = vec![
        observe(
            query(vec![criterion(&[("b", "2"), ("a", "1"), ("a", "1")])]),
            none_pos(),
        ),
        observe(
            query(vec![
                criterion(&[("a", "1"), ("b", "2")]),
                criterion(&[("a", "1"), ("b", "2")]),
            ]),
            none_pos(),
        ),
    ];
    let r = c
        .save("default", e(), merged)
        .await
        .expect("same query, same position merges");
    let context =
        c.es.get_write_context(pb::GetWriteContextRequest {
            boundary: "default".into(),
            write_id: r.write_id,
        })
        .await
        .expect("context")
        .into_inner();
    assert_eq!(context.consistency.len(), 1, "merged into one observation");
    assert_eq!(
        context.consistency[0]
            .query
            .as_ref()
            .expect("query")
            .criteria,
        vec![criterion(&[("a", "1"), ("b", "2")])],
        "tags sorted by key, duplicates removed"
    );
}

#[tokio::test]
async fn c2_stale_and_future_observations_conflict_exactly() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = account("acc-1");
    c.save(
        "default",
        vec![event("Opened", r#"{"accountId":"acc-1"}"#)],
        vec![observe(q.clone(), none_pos())],
    )
    .await
    .expect("nothing matched: (-1,-1) holds");
    c.save(
        "default",
        vec![event("Other", r#"{"accountId":"acc-2"}"#)],
        vec![],
    )
    .await
    .expect("unrelated");
    // Stale: the context is at (1, 0).
    let stale = c
        .save(
            "default",
            vec![event("Debited", r#"{"accountId":"acc-1"}"#)],
            vec![observe(q.clone(), none_pos())],
        )
        .await
        .expect_err("stale");
    assert_eq!(stale.code(), Code::AlreadyExists);
    assert_eq!(
        stale.message(),
        "OptimisticConcurrencyException:StreamVersionConflict: Expected (-1, -1), Actual (1, 0)"
    );
    // Claimed future: also a conflict.
    let future = c
        .save(
            "default",
            vec![event("Debited", r#"{"accountId":"acc-1"}"#)],
            vec![observe(q.clone(), pos(9, 8))],
        )
        .await
        .expect_err("future");
    assert_eq!(future.code(), Code::AlreadyExists);
    assert_eq!(
        future.message(),
        "OptimisticConcurrencyException:StreamVersionConflict: Expected (9, 8), Actual (1, 0)"
    );
    // Not the latest event overall, but the latest of the context: commits.
    let ok = c
        .save(
            "default",
            vec![event("Debited", r#"{"accountId":"acc-1"}"#)],
            vec![observe(q.clone(), pos(1, 0))],
        )
        .await
        .expect("exact");
    assert_eq!(pair(&ok.log_position), (3, 2));
    assert_nothing_written(&mut c, 3).await;
}

#[tokio::test]
async fn c2_every_observation_must_hold() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save("default", vec![event("T", r#"{"accountId":"a"}"#)], vec![])
        .await
        .expect("a");
    let both_ok = vec![
        observe(account("a"), pos(1, 0)),
        observe(account("b"), none_pos()),
    ];
    let one_stale = vec![
        observe(account("a"), pos(1, 0)),
        observe(account("b"), pos(1, 0)),
    ];
    let status = c
        .save("default", vec![event("T", "{}")], one_stale)
        .await
        .expect_err("one fails");
    assert_eq!(
        status.message(),
        "OptimisticConcurrencyException:StreamVersionConflict: Expected (1, 0), Actual (-1, -1)"
    );
    c.save("default", vec![event("T", "{}")], both_ok)
        .await
        .expect("all hold");
}

#[tokio::test]
async fn c3_a_writes_own_events_do_not_count_for_its_check() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = account("x");
    c.save(
        "default",
        vec![
            event("T", r#"{"accountId":"x"}"#),
            event("T", r#"{"accountId":"x"}"#),
        ],
        vec![observe(q.clone(), none_pos())],
    )
    .await
    .expect("own events are not observed");
    // Earlier committed writes do count.
    let status = c
        .save(
            "default",
            vec![event("T", r#"{"accountId":"x"}"#)],
            vec![observe(q, none_pos())],
        )
        .await
        .expect_err("earlier write counts");
    assert!(
        status.message().ends_with("Actual (2, 1)"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn c4_unconditional_appends_and_unrelated_events() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.save("default", vec![event("T", r#"{"accountId":"a"}"#)], vec![])
        .await
        .expect("unconditional");
    c.save("default", vec![event("T", r#"{"accountId":"a"}"#)], vec![])
        .await
        .expect("unconditional again");
    // Events of other contexts never conflict.
    for i in 0..5 {
        c.save(
            "default",
            vec![event("T", &format!(r#"{{"accountId":"other-{i}"}}"#))],
            vec![],
        )
        .await
        .expect("other");
    }
    c.save(
        "default",
        vec![event("T", "{}")],
        vec![observe(account("a"), pos(2, 1))],
    )
    .await
    .expect("context a is still at (2, 1)");
}

#[tokio::test]
async fn c5_retries_conflict_only_when_their_events_match_the_context() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = account("r");
    let matching = vec![event("Debited", r#"{"accountId":"r"}"#)];
    c.save(
        "default",
        matching.clone(),
        vec![observe(q.clone(), none_pos())],
    )
    .await
    .expect("first");
    let retry = c
        .save("default", matching, vec![observe(q.clone(), none_pos())])
        .await
        .expect_err("retry sees its own committed event");
    assert_eq!(retry.code(), Code::AlreadyExists);

    let unrelated = vec![event("Noted", r#"{"note":"x"}"#)];
    let obs = vec![observe(account("s"), none_pos())];
    c.save("default", unrelated.clone(), obs.clone())
        .await
        .expect("first");
    c.save("default", unrelated, obs)
        .await
        .expect("the same request commits twice");
    assert_eq!(c.read_all("default").await.len(), 3);
}

#[tokio::test]
async fn c6_legacy_save_events() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let legacy = |query: Option<pb::SaveQuery>, data: &str| pb::SaveEventsRequest {
        boundary: "default".into(),
        query,
        events: vec![event("T", data)],
    };
    let r =
        c.es.save_events(legacy(None, r#"{"accountId":"l"}"#))
            .await
            .expect("no query: unconditional")
            .into_inner();
    assert_eq!(r.write_id, "1:0");
    c.es.save_events(legacy(
        Some(pb::SaveQuery {
            expected_position: Some(pos(5, 5)),
            subset_query: Some(query(vec![])),
        }),
        "{}",
    ))
    .await
    .expect("empty subset query: unconditional");
    let stale =
        c.es.save_events(legacy(
            Some(pb::SaveQuery {
                expected_position: None,
                subset_query: Some(account("l")),
            }),
            "{}",
        ))
        .await
        .expect_err("absent expected position means (-1,-1)");
    assert_eq!(
        stale.message(),
        "OptimisticConcurrencyException:StreamVersionConflict: Expected (-1, -1), Actual (1, 0)"
    );
    c.es.save_events(legacy(
        Some(pb::SaveQuery {
            expected_position: Some(pos(1, 0)),
            subset_query: Some(account("l")),
        }),
        "{}",
    ))
    .await
    .expect("current expected position");
}

#[tokio::test]
async fn c7_write_context() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let get = |id: &str| pb::GetWriteContextRequest {
        boundary: "default".into(),
        write_id: id.into(),
    };
    let unconditional = c
        .save("default", vec![event("T", "{}"), event("T", "{}")], vec![])
        .await
        .expect("write");
    let observed = vec![observe(
        query(vec![
            criterion(&[("z", "1")]),
            criterion(&[("b", "2"), ("a", "1")]),
        ]),
        none_pos(),
    )];
    let conditional = c
        .save("default", vec![event("T", "{}")], observed)
        .await
        .expect("write");

    let ctx =
        c.es.get_write_context(get(&unconditional.write_id))
            .await
            .expect("found")
            .into_inner();
    assert_eq!(ctx.write_id, "2:1");
    assert!(ctx.consistency.is_empty());

    let ctx =
        c.es.get_write_context(get(&conditional.write_id))
            .await
            .expect("found")
            .into_inner();
    assert_eq!(ctx.consistency.len(), 1);
    let obs = &ctx.consistency[0];
    assert_eq!(pair(&obs.position), (-1, -1));
    assert_eq!(
        obs.query.as_ref().expect("query").criteria,
        vec![
            criterion(&[("a", "1"), ("b", "2")]),
            criterion(&[("z", "1")])
        ],
        "normalised: tags sorted by key, criteria sorted"
    );

    for bad in ["", "2", "02:1", "2:01", "a:b", "2:1:0", "-2:1", " 2:1"] {
        let status = c.es.get_write_context(get(bad)).await.expect_err("invalid");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}");
    }
    for unknown in ["99:98", "2:0", "1:0", "3:1"] {
        let status =
            c.es.get_write_context(get(unknown))
                .await
                .expect_err("unknown");
        assert_eq!(status.code(), Code::NotFound, "{unknown}");
    }
}
