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

/// Calls every RPC that names a boundary (the EventStore calls and Admin GetEventCount)
/// with `boundary` and otherwise valid input; returns each call's name and outcome.
async fn every_boundary_call(
    c: &mut Client,
    boundary: &str,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    let b = || boundary.to_string();
    let q = query(vec![criterion(&[("a", "1")])]);
    vec![
        (
            "SaveEvents",
            c.es.save_events(pb::SaveEventsRequest {
                boundary: b(),
                query: None,
                events: vec![event("T", "{}")],
            })
            .await
            .map(|_| ()),
        ),
        (
            "SaveEventsV2",
            c.save(
                boundary,
                vec![event("T", "{}")],
                vec![observe(q.clone(), none_pos())],
            )
            .await
            .map(|_| ()),
        ),
        (
            "GetWriteContext",
            c.es.get_write_context(pb::GetWriteContextRequest {
                boundary: b(),
                write_id: "1:0".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "GetEvents",
            c.read(boundary, None, None, 10, pb::Direction::Asc)
                .await
                .map(|_| ()),
        ),
        (
            "GetLatestByCriteria",
            c.latest(boundary, q.criteria.clone()).await.map(|_| ()),
        ),
        (
            "CatchUpSubscribeToEvents",
            c.es.catch_up_subscribe_to_events(pb::CatchUpSubscribeToEventStoreRequest {
                after_position: None,
                query: None,
                subscriber_name: "s".into(),
                boundary: b(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "CreateIndex",
            c.es.create_index(pb::CreateIndexRequest {
                boundary: b(),
                name: "i".into(),
                fields: vec![pb::IndexField {
                    json_key: "a".into(),
                    value_type: 0,
                }],
                ..Default::default()
            })
            .await
            .map(|_| ()),
        ),
        (
            "DropIndex",
            c.es.drop_index(pb::DropIndexRequest {
                boundary: b(),
                name: "i".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "ListIndexes",
            c.es.list_indexes(pb::ListIndexesRequest { boundary: b() })
                .await
                .map(|_| ()),
        ),
        (
            "GetIndex",
            c.es.get_index(pb::GetIndexRequest {
                boundary: b(),
                name: "i".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "GetEventCount",
            c.admin
                .get_event_count(pb::GetEventCountRequest { boundary: b() })
                .await
                .map(|_| ()),
        ),
    ]
}

#[tokio::test]
async fn b1_every_call_that_takes_a_boundary_rejects_a_malformed_name_first() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let catalog_before = c
        .admin
        .list_boundaries(pb::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner();
    for bad in ["9bad-name", "", "a.b", "ünï", &"x".repeat(64)] {
        let mut results = every_boundary_call(&mut c, bad).await;
        results.push((
            "CreateBoundary",
            c.admin
                .create_boundary(pb::CreateBoundaryRequest {
                    name: bad.to_string(),
                    ..Default::default()
                })
                .await
                .map(|_| ()),
        ));
        results.push((
            "GetBoundary",
            c.admin
                .get_boundary(pb::GetBoundaryRequest {
                    name: bad.to_string(),
                })
                .await
                .map(|_| ()),
        ));
        assert_eq!(results.len(), 13, "every call that takes a boundary");
        for (what, result) in results {
            let status = result.expect_err(what);
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{what} {bad:?}: {status:?}"
            );
            assert!(
                status
                    .message()
                    .starts_with(&format!("invalid boundary {bad:?}")),
                "{what}: {}",
                status.message()
            );
        }
    }
    // Nothing changed: no boundary appeared, nothing was written anywhere.
    let catalog_after = c
        .admin
        .list_boundaries(pb::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(catalog_after, catalog_before);
    for b in &catalog_after.boundaries {
        assert!(c.read_all(&b.name).await.is_empty(), "{} is empty", b.name);
    }
}

#[tokio::test]
async fn b2_every_event_store_rpc_gates_on_the_boundary() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let results = every_boundary_call(&mut c, "nope").await;
    assert_eq!(results.len(), 11);
    for (what, result) in results {
        let status = result.expect_err(what);
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
    }
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
    assert_eq!(names, vec!["default", "orders", "orisun_admin"]);
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
    assert_eq!(before.len(), 4, "alpha, beta, gamma and the admin boundary");
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

#[tokio::test]
async fn b5_the_admin_boundary_always_exists_and_any_user_reads_it() {
    let server = TestServer::start_with(|c| c.boundaries.clear()).await;
    let mut c = server.client();
    let admin_boundary = c
        .admin
        .get_boundary(pb::GetBoundaryRequest {
            name: "orisun_admin".into(),
        })
        .await
        .expect("the admin boundary exists with no boundaries declared")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(
        admin_boundary.status,
        pb::BoundaryLifecycleStatus::Active as i32
    );
    server.create_user("nobody", "n-pass", &[]).await;
    server.create_user("ops", "o-pass", &["OPERATIONS"]).await;
    for (user, password) in [("nobody", "n-pass"), ("ops", "o-pass"), ADMIN] {
        let mut reader = server.client_with(Credentials::basic(user, password));
        let events = reader
            .read("orisun_admin", None, None, 1, pb::Direction::Asc)
            .await
            .unwrap_or_else(|e| panic!("{user} reads the admin boundary: {e:?}"));
        assert!(events.is_empty(), "Cairn keeps nothing there");
    }
    // Declaring it again among the boundaries changes nothing.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, |c| {
        c.boundaries = vec!["orisun_admin".to_string()];
    })
    .await;
    let again = server
        .client()
        .admin
        .get_boundary(pb::GetBoundaryRequest {
            name: "orisun_admin".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(again, admin_boundary);
}
