use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::Code;

fn index(name: &str, key: &str) -> pb::CreateIndexRequest {
    pb::CreateIndexRequest {
        boundary: "default".into(),
        name: name.into(),
        fields: vec![pb::IndexField {
            json_key: key.into(),
            value_type: pb::ValueType::Text as i32,
        }],
        conditions: vec![pb::IndexCondition {
            key: "eventType".into(),
            operator: "=".into(),
            value: "T".into(),
        }],
        condition_combinator: pb::ConditionCombinator::And as i32,
    }
}

#[tokio::test]
async fn i1_create_get_list_drop() {
    let server = TestServer::start().await;
    let mut c = server.client();
    c.es.create_index(index("by_account", "accountId"))
        .await
        .expect("create");
    c.es.create_index(index("by_account", "accountId"))
        .await
        .expect("identical definition is OK");
    let different =
        c.es.create_index(index("by_account", "other"))
            .await
            .expect_err("different");
    assert_eq!(different.code(), Code::AlreadyExists);
    c.es.create_index(index("another", "x"))
        .await
        .expect("create");

    let got =
        c.es.get_index(pb::GetIndexRequest {
            boundary: "default".into(),
            name: "by_account".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .index
        .expect("index");
    assert_eq!(got.name, "by_account");
    assert_eq!(got.fields[0].json_key, "accountId");
    assert_eq!(got.conditions.len(), 1);
    assert_eq!(got.state, pb::IndexState::Ready as i32);
    let names: Vec<String> =
        c.es.list_indexes(pb::ListIndexesRequest {
            boundary: "default".into(),
        })
        .await
        .expect("list")
        .into_inner()
        .indexes
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, vec!["another", "by_account"]);
    let missing =
        c.es.get_index(pb::GetIndexRequest {
            boundary: "default".into(),
            name: "nope".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(missing.code(), Code::NotFound);
    c.es.drop_index(pb::DropIndexRequest {
        boundary: "default".into(),
        name: "by_account".into(),
    })
    .await
    .expect("drop");
    let gone =
        c.es.get_index(pb::GetIndexRequest {
            boundary: "default".into(),
            name: "by_account".into(),
        })
        .await
        .expect_err("dropped");
    assert_eq!(gone.code(), Code::NotFound);
    let drop_missing =
        c.es.drop_index(pb::DropIndexRequest {
            boundary: "default".into(),
            name: "by_account".into(),
        })
        .await
        .expect_err("dropped twice");
    assert_eq!(drop_missing.code(), Code::NotFound);
}

#[tokio::test]
async fn i1_definitions_are_validated() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let mut no_fields = index("a", "k");
    no_fields.fields.clear();
    let mut empty_key = index("b", "");
    empty_key.fields[0].json_key.clear();
    let mut bad_operator = index("c", "k");
    bad_operator.conditions[0].operator = "!=".into();
    let bad_name = index("1-bad", "k");
    let mut bad_type = index("d", "k");
    bad_type.fields[0].value_type = 42;
    for (what, req) in [
        ("no fields", no_fields),
        ("empty json_key", empty_key),
        ("bad operator", bad_operator),
        ("bad name", bad_name),
        ("bad value type", bad_type),
    ] {
        let status = c.es.create_index(req).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}");
    }
    for op in ["=", ">", "<", ">=", "<="] {
        let mut ok = index(&format!("op_{}", op.len()), "k");
        ok.name = format!(
            "op_{}",
            op.replace('>', "gt").replace('<', "lt").replace('=', "eq")
        );
        ok.conditions[0].operator = op.into();
        c.es.create_index(ok).await.expect("valid operator");
    }
}

#[tokio::test]
async fn i2_indexes_never_change_results() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for i in 0..20 {
        c.save(
            "default",
            vec![event(
                "T",
                &format!(r#"{{"accountId":"a{}","n":{i}}}"#, i % 3),
            )],
            vec![],
        )
        .await
        .expect("write");
    }
    let q = query(vec![criterion(&[("accountId", "a1")])]);
    let before = c
        .read("default", Some(q.clone()), None, 100, pb::Direction::Asc)
        .await
        .expect("read");
    let latest_before = c
        .latest("default", q.criteria.clone())
        .await
        .expect("latest");
    c.es.create_index(index("by_account", "accountId"))
        .await
        .expect("create");
    let after = c
        .read("default", Some(q.clone()), None, 100, pb::Direction::Asc)
        .await
        .expect("read");
    let latest_after = c
        .latest("default", q.criteria.clone())
        .await
        .expect("latest");
    assert_eq!(before, after);
    assert_eq!(latest_before, latest_after);
    assert_eq!(before.len(), 7);
}
