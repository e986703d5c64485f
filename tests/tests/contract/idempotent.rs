//! X1: idempotent retries by event id, opt-in per boundary (wire contract §3). A boundary
//! declared with `--idempotent-boundaries` or created through `cairn.v1.Boundaries` with the
//! option answers an identical retry with the original result and writes nothing, refuses
//! any other reuse of a stored id with ALREADY_EXISTS naming the id and its position, and
//! refuses an id twice in one write. Every other boundary keeps Orisun's behaviour.

use cairn_core::Error;
use cairn_core::error::EventIdReuse;
use cairn_tests::cairn_v1 as cairn;
use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

const IDEMPOTENT: &str = "payments";

async fn server() -> TestServer {
    TestServer::start_with(|c| c.idempotent_boundaries = vec![IDEMPOTENT.to_string()]).await
}

fn with_id(id: &str, event_type: &str, data: &str) -> pb::EventToSave {
    pb::EventToSave {
        event_id: id.to_string(),
        ..event(event_type, data)
    }
}

fn payment(id: &str) -> pb::Query {
    query(vec![criterion(&[("paymentId", id)])])
}

/// The two events of the write every test starts from, in order.
fn first_write() -> Vec<pb::EventToSave> {
    vec![
        with_id(
            "e-1",
            "PaymentRequested",
            r#"{"paymentId":"p1","amount":5}"#,
        ),
        with_id("e-2", "PaymentApproved", r#"{"paymentId":"p1"}"#),
    ]
}

/// A boundary as Orisun's GetBoundary shows it.
async fn orisun_boundary(c: &mut Client, name: &str) -> pb::BoundaryInfo {
    c.admin
        .get_boundary(pb::GetBoundaryRequest { name: name.into() })
        .await
        .expect("orisun get")
        .into_inner()
        .boundary
        .expect("boundary")
}

fn domain_error(status: &tonic::Status) -> Error {
    cairn_proto::from_status(status)
}

#[tokio::test]
async fn x1_an_identical_retry_gets_the_original_result_and_writes_nothing() {
    let server = server().await;
    let mut c = server.client();
    let context = vec![observe(payment("p1"), none_pos())];
    let original = c
        .save(IDEMPOTENT, first_write(), context.clone())
        .await
        .expect("first write");
    // The observation no longer holds (the write itself moved the context): a retry still
    // gets the original answer, the way it would have had the reply not been lost.
    let retry = c
        .save(IDEMPOTENT, first_write(), context.clone())
        .await
        .expect("identical retry");
    assert_eq!(retry, original);
    // Unconditional retries too, and after later writes to the boundary.
    c.save(
        IDEMPOTENT,
        vec![with_id("e-3", "PaymentRequested", r#"{"paymentId":"p2"}"#)],
        vec![],
    )
    .await
    .expect("another write");
    let later = c
        .save(IDEMPOTENT, first_write(), vec![])
        .await
        .expect("retry after later writes");
    assert_eq!(later, original);
    assert_eq!(
        c.read_all(IDEMPOTENT).await.len(),
        3,
        "retries wrote nothing"
    );

    // Across a restart: the id index is state, not memory.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, |c| {
        c.idempotent_boundaries = vec![IDEMPOTENT.to_string()];
    })
    .await;
    let mut c = server.client();
    let after_restart = c
        .save(IDEMPOTENT, first_write(), context)
        .await
        .expect("retry after a restart");
    assert_eq!(after_restart, original);
    let events = c.read_all(IDEMPOTENT).await;
    assert_eq!(events.len(), 3);
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["e-1", "e-2", "e-3"]);
}

/// A refused reuse: (case, events sent, reused id named, its stored position, why).
type ReuseCase = (
    &'static str,
    Vec<pb::EventToSave>,
    &'static str,
    (i64, i64),
    EventIdReuse,
);

#[tokio::test]
async fn x1_any_other_reuse_of_a_stored_id_is_already_exists_naming_it() {
    let server = server().await;
    let mut c = server.client();
    let first = c
        .save(IDEMPOTENT, first_write(), vec![])
        .await
        .expect("first write");
    assert_eq!(pair(&first.log_position), (2, 1));
    c.save(
        IDEMPOTENT,
        vec![with_id("e-3", "PaymentRequested", r#"{"paymentId":"p2"}"#)],
        vec![],
    )
    .await
    .expect("second write");
    let [e1, e2] = <[pb::EventToSave; 2]>::try_from(first_write()).expect("two events");
    let fresh = with_id("e-new", "PaymentRequested", r#"{"paymentId":"p9"}"#);
    let altered = |f: fn(&mut pb::EventToSave)| {
        let mut events = first_write();
        f(&mut events[1]);
        events
    };
    let cases: Vec<ReuseCase> = vec![
        (
            "a part of the write",
            vec![e1.clone()],
            "e-1",
            (2, 0),
            EventIdReuse::PartialOverlap,
        ),
        (
            "its second half",
            vec![e2.clone()],
            "e-2",
            (2, 1),
            EventIdReuse::PartialOverlap,
        ),
        (
            "the write plus a new event",
            vec![e1.clone(), e2.clone(), fresh.clone()],
            "e-1",
            (2, 0),
            EventIdReuse::PartialOverlap,
        ),
        (
            "a new event, then a stored one",
            vec![fresh.clone(), e2.clone()],
            "e-2",
            (2, 1),
            EventIdReuse::PartialOverlap,
        ),
        (
            "ids of two writes",
            vec![
                e1.clone(),
                with_id("e-3", "PaymentRequested", r#"{"paymentId":"p2"}"#),
            ],
            "e-1",
            (2, 0),
            EventIdReuse::SeveralWrites,
        ),
        (
            "altered data",
            altered(|e| e.data = r#"{"paymentId":"p1","by":"mallory"}"#.into()),
            "e-1",
            (2, 0),
            EventIdReuse::Altered,
        ),
        (
            "altered metadata",
            altered(|e| e.metadata = r#"{"traceId":"t"}"#.into()),
            "e-1",
            (2, 0),
            EventIdReuse::Altered,
        ),
        (
            "altered type",
            altered(|e| e.event_type = "PaymentDeclined".into()),
            "e-1",
            (2, 0),
            EventIdReuse::Altered,
        ),
        (
            "reordered",
            vec![e2.clone(), e1.clone()],
            "e-2",
            (2, 1),
            EventIdReuse::Altered,
        ),
    ];
    for (case, events, id, (commit, prepare), reason) in cases {
        let status = c.save(IDEMPOTENT, events, vec![]).await.expect_err(case);
        assert_eq!(status.code(), Code::AlreadyExists, "{case}: {status:?}");
        let message = status.message();
        assert!(
            message.contains(&format!("event_id \"{id}\""))
                && message.contains(&format!("at position ({commit}, {prepare})")),
            "{case}: {message}"
        );
        assert_eq!(
            domain_error(&status),
            Error::EventIdExists {
                boundary: IDEMPOTENT.into(),
                event_id: id.into(),
                position: cairn_core::Position::new(commit, prepare),
                reason,
            },
            "{case}: decoded from the status details"
        );
    }
    assert_eq!(c.read_all(IDEMPOTENT).await.len(), 3, "no refusal wrote");
}

#[tokio::test]
async fn x1_an_id_twice_in_one_write_is_invalid_argument() {
    let server = server().await;
    let mut c = server.client();
    let twice = vec![
        with_id("dup", "A", "{}"),
        with_id("other", "B", "{}"),
        with_id("dup", "C", "{}"),
    ];
    let status = c
        .save(IDEMPOTENT, twice, vec![])
        .await
        .expect_err("an id twice");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("event 2: event_id \"dup\" appears more than once"),
        "{}",
        status.message()
    );
    assert!(c.read_all(IDEMPOTENT).await.is_empty());
}

#[tokio::test]
async fn x1_boundaries_without_the_option_store_duplicates_as_orisun_does() {
    let server = server().await;
    let mut c = server.client();
    let first = c
        .save("default", first_write(), vec![])
        .await
        .expect("first write");
    let again = c
        .save("default", first_write(), vec![])
        .await
        .expect("a duplicate is another write");
    assert_ne!(again, first);
    let twice = vec![with_id("dup", "A", "{}"), with_id("dup", "A", "{}")];
    c.save("default", twice, vec![])
        .await
        .expect("an id twice in one write is stored too");
    let ids: Vec<String> = c
        .read_all("default")
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(ids, ["e-1", "e-2", "e-1", "e-2", "dup", "dup"]);
    // The same ids in the idempotent boundary are independent of the plain one's.
    c.save(IDEMPOTENT, first_write(), vec![])
        .await
        .expect("ids are per boundary");
}

#[tokio::test]
async fn x1_the_option_is_set_at_creation_and_shown_wherever_boundaries_are() {
    let server = server().await;
    let mut c = server.client();
    let created = c
        .boundaries
        .create_boundary(cairn::CreateBoundaryRequest {
            name: "orders".into(),
            description: "orders of the shop".into(),
            options: Some(cairn::BoundaryOptions {
                idempotent_event_ids: true,
            }),
        })
        .await
        .expect("create with options")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(
        created,
        cairn::Boundary {
            name: "orders".into(),
            description: "orders of the shop".into(),
            options: Some(cairn::BoundaryOptions {
                idempotent_event_ids: true,
            }),
            status: "ACTIVE".into(),
            event_count: 0,
        }
    );
    // It behaves as declared.
    let original = c
        .save("orders", first_write(), vec![])
        .await
        .expect("write");
    assert_eq!(
        c.save("orders", first_write(), vec![])
            .await
            .expect("retry"),
        original
    );
    let status = c
        .boundaries
        .create_boundary(cairn::CreateBoundaryRequest {
            name: "orders".into(),
            ..Default::default()
        })
        .await
        .expect_err("the name is taken");
    assert_eq!(status.code(), Code::AlreadyExists);

    // Cairn's messages carry the option; Orisun's note it in the description.
    let listed = c
        .boundaries
        .list_boundaries(cairn::ListBoundariesRequest {})
        .await
        .expect("list")
        .into_inner()
        .boundaries;
    let option = |name: &str| {
        listed
            .iter()
            .find(|b| b.name == name)
            .and_then(|b| b.options)
            .map(|o| o.idempotent_event_ids)
    };
    assert_eq!(option("orders"), Some(true));
    assert_eq!(option(IDEMPOTENT), Some(true), "declared by the flag");
    assert_eq!(option("default"), Some(false));
    let got = c
        .boundaries
        .get_boundary(cairn::GetBoundaryRequest {
            name: "orders".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .boundary
        .expect("boundary");
    assert_eq!(got.event_count, 2);
    let orisun = orisun_boundary(&mut c, "orders").await;
    assert_eq!(
        orisun.description,
        "orders of the shop [cairn: idempotent event ids]"
    );
    let plain = orisun_boundary(&mut c, "default").await;
    assert!(!plain.description.contains("idempotent"));
    let missing = c
        .boundaries
        .get_boundary(cairn::GetBoundaryRequest {
            name: "nowhere".into(),
        })
        .await
        .expect_err("no such boundary");
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn x1_creating_a_boundary_with_options_needs_the_admin_role() {
    let server = server().await;
    server
        .create_user("writer", "writer-pw", &["OPERATIONS"])
        .await;
    let mut writer = server.client_with(Credentials::basic("writer", "writer-pw"));
    let status = writer
        .boundaries
        .create_boundary(cairn::CreateBoundaryRequest {
            name: "sneaky".into(),
            ..Default::default()
        })
        .await
        .expect_err("not an admin");
    assert_eq!(status.code(), Code::PermissionDenied);
    let listed = writer
        .boundaries
        .list_boundaries(cairn::ListBoundariesRequest {})
        .await
        .expect("any user may read")
        .into_inner()
        .boundaries;
    assert!(listed.iter().all(|b| b.name != "sneaky"));
    let anonymous = server
        .client_with(Credentials::none())
        .boundaries
        .list_boundaries(cairn::ListBoundariesRequest {})
        .await
        .expect_err("no credentials");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
}
