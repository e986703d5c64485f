use cairn_tests::orisun as pb;
use cairn_tests::*;
use futures::StreamExt;
use tonic::Code;

#[tokio::test]
async fn b1_boundary_names_are_identifiers() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for bad in ["", "1abc", "a-b", "a b", "ünï", "a.b", &"x".repeat(64)] {
        let status = c
            .admin
            .create_boundary(pb::CreateBoundaryRequest {
                name: bad.to_string(),
                ..Default::default()
            })
            .await
            .expect_err("invalid name");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}");
    }
    for good in ["_x", "Orders_2", &"y".repeat(63)] {
        c.admin
            .create_boundary(pb::CreateBoundaryRequest {
                name: good.to_string(),
                ..Default::default()
            })
            .await
            .expect("valid name");
    }
}

#[tokio::test]
async fn b2_every_event_store_rpc_gates_on_the_boundary() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = query(vec![criterion(&[("a", "1")])]);
    let expect_gate = |r: Result<(), tonic::Status>, what: &str| {
        let status = r.expect_err(what);
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{what}: {status:?}"
        );
        assert_eq!(
            status.message(),
            "boundary \"nope\" is not active",
            "{what}"
        );
    };
    expect_gate(
        c.es.save_events(pb::SaveEventsRequest {
            boundary: "nope".into(),
            query: None,
            events: vec![event("T", "{}")],
        })
        .await
        .map(|_| ()),
        "SaveEvents",
    );
    expect_gate(
        c.save("nope", vec![event("T", "{}")], vec![])
            .await
            .map(|_| ()),
        "SaveEventsV2",
    );
    expect_gate(
        c.es.get_write_context(pb::GetWriteContextRequest {
            boundary: "nope".into(),
            write_id: "1:0".into(),
        })
        .await
        .map(|_| ()),
        "GetWriteContext",
    );
    expect_gate(
        c.read("nope", None, None, 10, pb::Direction::Asc)
            .await
            .map(|_| ()),
        "GetEvents",
    );
    expect_gate(
        c.latest("nope", q.criteria.clone()).await.map(|_| ()),
        "GetLatestByCriteria",
    );
    expect_gate(
        c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: None,
            query: None,
            subscriber_name: "s".into(),
            boundary: "nope".into(),
        })
        .await
        .map(|_| ()),
        "CatchUpSubscribeToEvents",
    );
    expect_gate(
        c.es.create_index(pb::CreateIndexRequest {
            boundary: "nope".into(),
            name: "i".into(),
            fields: vec![pb::IndexField {
                json_key: "a".into(),
                value_type: 0,
            }],
            ..Default::default()
        })
        .await
        .map(|_| ()),
        "CreateIndex",
    );
    expect_gate(
        c.es.drop_index(pb::DropIndexRequest {
            boundary: "nope".into(),
            name: "i".into(),
        })
        .await
        .map(|_| ()),
        "DropIndex",
    );
    expect_gate(
        c.es.list_indexes(pb::ListIndexesRequest {
            boundary: "nope".into(),
        })
        .await
        .map(|_| ()),
        "ListIndexes",
    );
    expect_gate(
        c.es.get_index(pb::GetIndexRequest {
            boundary: "nope".into(),
            name: "i".into(),
        })
        .await
        .map(|_| ()),
        "GetIndex",
    );
    expect_gate(
        c.admin
            .get_event_count(pb::GetEventCountRequest {
                boundary: "nope".into(),
            })
            .await
            .map(|_| ()),
        "GetEventCount",
    );
    // Once created, the same calls work.
    server.create_boundary("nope").await;
    c.save("nope", vec![event("T", "{}")], vec![])
        .await
        .expect("now active");
    let mut sub =
        c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
            after_position: Some(pos(0, 0)),
            query: None,
            subscriber_name: "s".into(),
            boundary: "nope".into(),
        })
        .await
        .expect("subscribe")
        .into_inner();
    assert!(sub.next().await.expect("event").is_ok());
}

#[tokio::test]
async fn b3_create_get_list_and_duplicates() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let created = c
        .admin
        .create_boundary(pb::CreateBoundaryRequest {
            name: "orders".into(),
            description: "order events".into(),
            placement: Some(pb::BoundaryPlacementInput {
                backend: "any".into(),
                namespace: "ns".into(),
            }),
            existed_before_catalog: false,
        })
        .await
        .expect("create")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(created.status, pb::BoundaryLifecycleStatus::Active as i32);
    assert_eq!(created.description, "order events");
    assert_eq!(
        created.placement.as_ref().expect("placement").namespace,
        "ns"
    );

    let duplicate = c
        .admin
        .create_boundary(pb::CreateBoundaryRequest {
            name: "orders".into(),
            ..Default::default()
        })
        .await
        .expect_err("duplicate");
    assert_eq!(duplicate.code(), Code::AlreadyExists);

    let got = c
        .admin
        .get_boundary(pb::GetBoundaryRequest {
            name: "orders".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(got, created);
    let missing = c
        .admin
        .get_boundary(pb::GetBoundaryRequest {
            name: "ghost".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(missing.code(), Code::NotFound);
    let names: Vec<String> = c
        .admin
        .list_boundaries(pb::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner()
        .boundaries
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, vec!["default", "orders"]);
}

#[tokio::test]
async fn b4_declared_boundaries_are_created_idempotently_and_survive_restarts() {
    let declare = |c: &mut cairn_server::ServeConfig| {
        c.boundaries = vec!["alpha".to_string(), "beta".to_string()];
    };
    let server = TestServer::start_with(declare).await;
    server.create_boundary("gamma").await;
    let mut c = server.client();
    c.save("alpha", vec![event("T", "{}")], vec![])
        .await
        .expect("alpha is active");
    let before = c
        .admin
        .list_boundaries(pb::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner()
        .boundaries;
    assert_eq!(before.len(), 3);
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, declare).await;
    let after = server
        .client()
        .admin
        .list_boundaries(pb::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner()
        .boundaries;
    assert_eq!(
        after, before,
        "same boundaries, definition and status positions"
    );
    let count = server
        .client()
        .admin
        .get_event_count(pb::GetEventCountRequest {
            boundary: "alpha".into(),
        })
        .await
        .expect("count")
        .into_inner()
        .count;
    assert_eq!(count, 1);
}
