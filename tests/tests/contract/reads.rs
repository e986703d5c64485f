use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

async fn seed(c: &mut Client) {
    // Positions: (1,0) (3,1) (3,2) (4,3) (6,4) (6,5)
    let writes: [&[&str]; 4] = [
        &[r#"{"n":0,"even":true}"#],
        &[r#"{"n":1,"even":false}"#, r#"{"n":2,"even":true}"#],
        &[r#"{"n":3,"even":false}"#],
        &[r#"{"n":4,"even":true}"#, r#"{"n":5,"even":false}"#],
    ];
    for w in writes {
        c.save("default", w.iter().map(|d| event("T", d)).collect(), vec![])
            .await
            .expect("seed");
    }
}

fn ns(events: &[pb::Event]) -> Vec<i64> {
    events.iter().map(|e| pair(&e.position).1).collect()
}

#[tokio::test]
async fn g1_count_is_bounded() {
    let server = TestServer::start().await;
    let mut c = server.client();
    seed(&mut c).await;
    for bad in [0, 10_001, u32::MAX] {
        let status = c
            .read("default", None, None, bad, pb::Direction::Asc)
            .await
            .expect_err("count");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
    }
    assert_eq!(
        c.read("default", None, None, 10_000, pb::Direction::Asc)
            .await
            .expect("max")
            .len(),
        6
    );
    assert_eq!(
        ns(&c
            .read("default", None, None, 2, pb::Direction::Asc)
            .await
            .expect("page")),
        vec![0, 1]
    );
    let bad_direction =
        c.es.get_events(pb::GetEventsRequest {
            boundary: "default".into(),
            count: 1,
            direction: 7,
            ..Default::default()
        })
        .await
        .expect_err("direction");
    assert_eq!(bad_direction.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn g1_directions_and_inclusive_starts() {
    let server = TestServer::start().await;
    let mut c = server.client();
    seed(&mut c).await;
    let read = |q: Option<pb::Query>, from: Option<pb::Position>, d: pb::Direction| {
        let mut c = c.clone();
        async move { ns(&c.read("default", q, from, 100, d).await.expect("read")) }
    };
    use pb::Direction::{Asc, Desc};
    assert_eq!(read(None, None, Asc).await, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(read(None, None, Desc).await, vec![5, 4, 3, 2, 1, 0]);
    assert_eq!(
        read(None, Some(pos(3, 2)), Asc).await,
        vec![2, 3, 4, 5],
        "ASC is ≥ from"
    );
    assert_eq!(
        read(None, Some(pos(3, 2)), Desc).await,
        vec![2, 1, 0],
        "DESC is ≤ from"
    );
    // Positions that are not event positions.
    assert_eq!(
        read(None, Some(pos(0, 0)), Asc).await,
        vec![0, 1, 2, 3, 4, 5]
    );
    assert_eq!(read(None, Some(pos(3, 0)), Asc).await, vec![1, 2, 3, 4, 5]);
    assert_eq!(read(None, Some(pos(5, 9)), Asc).await, vec![4, 5]);
    assert_eq!(read(None, Some(pos(5, 9)), Desc).await, vec![3, 2, 1, 0]);
    assert_eq!(read(None, Some(pos(100, 0)), Asc).await, Vec::<i64>::new());
    assert_eq!(
        read(None, Some(pos(100, 0)), Desc).await,
        vec![5, 4, 3, 2, 1, 0]
    );
    assert_eq!(read(None, Some(pos(0, 0)), Desc).await, Vec::<i64>::new());
    // With a filter.
    let even = Some(query(vec![criterion(&[("even", "true")])]));
    assert_eq!(read(even.clone(), None, Asc).await, vec![0, 2, 4]);
    assert_eq!(read(even.clone(), None, Desc).await, vec![4, 2, 0]);
    assert_eq!(read(even.clone(), Some(pos(3, 2)), Asc).await, vec![2, 4]);
    assert_eq!(read(even.clone(), Some(pos(4, 3)), Desc).await, vec![2, 0]);
    let page = c
        .read("default", even, Some(pos(3, 1)), 1, Asc)
        .await
        .expect("page");
    assert_eq!(ns(&page), vec![2]);
}

#[tokio::test]
async fn g2_latest_by_criteria() {
    let server = TestServer::start().await;
    let mut c = server.client();
    seed(&mut c).await;
    for bad in [
        vec![],
        vec![criterion(&[])],
        vec![criterion(&[("even", "true")]), criterion(&[])],
    ] {
        let status = c.latest("default", bad).await.expect_err("invalid");
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    let criteria = vec![
        criterion(&[("even", "true")]),
        criterion(&[("n", "3"), ("even", "false")]),
        criterion(&[("n", "99")]),
        criterion(&[("even", "false"), ("n", "1")]),
    ];
    let r = c.latest("default", criteria.clone()).await.expect("latest");
    assert_eq!(r.results.len(), 4);
    let echoed: Vec<pb::Criterion> = r
        .results
        .iter()
        .map(|x| x.criterion.clone().expect("echo"))
        .collect();
    assert_eq!(echoed, criteria, "criteria are echoed in request order");
    let found: Vec<Option<(i64, i64)>> = r
        .results
        .iter()
        .map(|x| x.event.as_ref().map(|e| pair(&e.position)))
        .collect();
    assert_eq!(found, vec![Some((6, 4)), Some((4, 3)), None, Some((3, 1))]);
    assert_eq!(
        r.results[0].event.as_ref().expect("event").data,
        r#"{"n":4,"even":true}"#
    );
    assert_eq!(pair(&r.context_position), (6, 4), "max of found positions");

    let none = c
        .latest("default", vec![criterion(&[("n", "99")])])
        .await
        .expect("latest");
    assert_eq!(pair(&none.context_position), (-1, -1));

    // The criteria as one query at the context position form a current observation.
    c.save(
        "default",
        vec![event("T", "{}")],
        vec![observe(
            query(criteria.clone()),
            r.context_position.expect("p"),
        )],
    )
    .await
    .expect("current observation commits");
    c.save(
        "default",
        vec![event("T", r#"{"n":99}"#)],
        vec![observe(query(vec![criterion(&[("n", "99")])]), none_pos())],
    )
    .await
    .expect("(-1,-1) for no match commits");
    let stale = c
        .save(
            "default",
            vec![event("T", "{}")],
            vec![observe(query(criteria), r.context_position.expect("p"))],
        )
        .await
        .expect_err("now stale");
    assert_eq!(stale.code(), Code::AlreadyExists);
}
