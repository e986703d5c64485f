use cairn_tests::orisun as pb;
use cairn_tests::*;
use tonic::{Code, Status};

#[tokio::test]
async fn a1_requests_without_valid_credentials_are_unauthenticated() {
    let server = TestServer::start().await;
    for credentials in [
        Credentials::none(),
        Credentials::basic("admin", "wrong"),
        Credentials::basic("nobody", "changeit"),
        Credentials::token("forged.token"),
    ] {
        let mut c = server.client_with(credentials);
        let status = c.es.ping(pb::PingRequest {}).await.expect_err("rejected");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let status = c
            .admin
            .list_boundaries(pb::ListBoundariesRequest {})
            .await
            .expect_err("rejected");
        assert_eq!(status.code(), Code::Unauthenticated);
    }
}

#[tokio::test]
async fn a1_health_needs_no_credentials() {
    let server = TestServer::start().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel());
    let response = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health without credentials");
    assert_eq!(
        response.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn a1_basic_login_returns_a_session_token_that_authenticates_and_slides() {
    let server = TestServer::start().await;
    let response = server
        .client()
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("basic works");
    let token = token_in(response.metadata());
    let mut with_token = server.client_with(Credentials::token(&token));
    let response = with_token
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("token works");
    assert!(
        response.metadata().get("x-auth-token").is_some(),
        "token responses carry a fresh token"
    );
    // Errors of authenticated requests carry the header too.
    let status = with_token
        .save("nope", vec![event("T", "{}")], vec![])
        .await
        .expect_err("unknown boundary");
    assert!(status.metadata().get("x-auth-token").is_some());
}

#[tokio::test]
async fn a2_roles_are_exactly_admin_and_operations() {
    let server = TestServer::start().await;
    let mut c = server.client();
    for bad in [vec!["READER"], vec!["admin"], vec!["ADMIN", "SUPERUSER"]] {
        let status = c
            .admin
            .create_user(pb::CreateUserRequest {
                name: "x".into(),
                username: "x".into(),
                password: "pw".into(),
                roles: bad.iter().map(|s| s.to_string()).collect(),
            })
            .await
            .expect_err("bad role");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}");
    }
    let users = c
        .admin
        .list_users(pb::ListUsersRequest {})
        .await
        .expect("list")
        .into_inner()
        .users;
    assert_eq!(users.len(), 1, "nothing was created");
    assert_eq!(users[0].username, "admin");
    assert_eq!(users[0].roles, vec!["ADMIN"]);
}

#[tokio::test]
async fn a3_roles_gate_writes_indexes_and_administration() {
    let server = TestServer::start().await;
    server.create_user("ops", "ops-pw", &["OPERATIONS"]).await;
    server.create_user("reader", "reader-pw", &[]).await;
    let mut ops = server.client_with(Credentials::basic("ops", "ops-pw"));
    let mut reader = server.client_with(Credentials::basic("reader", "reader-pw"));
    let index = || pb::CreateIndexRequest {
        boundary: "default".into(),
        name: "by_type".into(),
        fields: vec![pb::IndexField {
            json_key: "eventType".into(),
            value_type: pb::ValueType::Text as i32,
        }],
        ..Default::default()
    };

    // Reader: reads, Ping, GetServerInfo, subscriptions; no writes, no index reads.
    let denied = reader
        .save("default", vec![event("T", "{}")], vec![])
        .await
        .expect_err("no write");
    assert_eq!(denied.code(), Code::PermissionDenied);
    reader.read_all("default").await;
    reader.es.ping(pb::PingRequest {}).await.expect("ping");
    reader
        .es
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .expect("info");
    let denied = reader
        .es
        .list_indexes(pb::ListIndexesRequest {
            boundary: "default".into(),
        })
        .await
        .expect_err("no index list");
    assert_eq!(denied.code(), Code::PermissionDenied);

    // Operations: writes and index reads, not index changes or administration.
    ops.save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("ops writes");
    ops.es
        .list_indexes(pb::ListIndexesRequest {
            boundary: "default".into(),
        })
        .await
        .expect("ops lists indexes");
    assert_eq!(
        ops.es
            .create_index(index())
            .await
            .expect_err("no create")
            .code(),
        Code::PermissionDenied
    );
    let denied = ops
        .admin
        .create_boundary(pb::CreateBoundaryRequest {
            name: "b2".into(),
            ..Default::default()
        })
        .await
        .expect_err("no admin");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(
        ops.admin
            .list_users(pb::ListUsersRequest {})
            .await
            .expect_err("no users")
            .code(),
        Code::PermissionDenied
    );

    // Admin: everything.
    server
        .client()
        .es
        .create_index(index())
        .await
        .expect("admin creates index");
}

fn files_contain(dir: &std::path::Path, needle: &[u8]) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("dir") {
                stack.push(entry.expect("entry").path());
            }
        } else if let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|w| w == needle)
        {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a3_passwords_are_stored_hashed() {
    let server = TestServer::start().await;
    let secret = "plaintext-secret-7f3a9c";
    server.create_user("alice", secret, &["OPERATIONS"]).await;
    let dir = server.stop().await;
    assert!(
        !files_contain(dir.path(), secret.as_bytes()),
        "the password appears in clear in the data directory"
    );
    assert!(
        files_contain(dir.path(), b"$argon2id$"),
        "an argon2id hash is stored"
    );
}

#[tokio::test]
async fn a1_a_session_ends_at_its_maximum_age_however_busy_it_is() {
    let server =
        TestServer::start_with(|c| c.token_max_age = std::time::Duration::from_secs(2)).await;
    let mut token = token_of(&server, ADMIN.0, ADMIN.1).await;
    let started = std::time::Instant::now();
    // Keep the session busy with its newest token; it must still end.
    let refused = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "a token-only session outlived its 2 s maximum age by far"
        );
        match server
            .client_with(Credentials::token(&token))
            .es
            .ping(pb::PingRequest {})
            .await
        {
            Ok(response) => token = token_in(response.metadata()),
            Err(status) => break status,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // The password begins a new session.
    token_of(&server, ADMIN.0, ADMIN.1).await;
}

#[tokio::test]
async fn a2_a_deleted_bootstrap_admin_stays_deleted_across_restarts() {
    let server = TestServer::start().await;
    server
        .create_user("root", "root-password", &["ADMIN"])
        .await;
    let mut root = server.client_with(Credentials::basic("root", "root-password"));
    let users = |list: pb::ListUsersResponse| -> Vec<String> {
        list.users.into_iter().map(|u| u.username).collect()
    };
    let listed = root
        .admin
        .list_users(pb::ListUsersRequest {})
        .await
        .expect("list")
        .into_inner();
    let admin_id = listed
        .users
        .iter()
        .find(|u| u.username == ADMIN.0)
        .expect("the bootstrap admin")
        .user_id
        .clone();
    root.admin
        .delete_user(pb::DeleteUserRequest { user_id: admin_id })
        .await
        .expect("delete the bootstrap admin");
    // A restart is a new leadership: before, its start-up writes re-created the admin
    // with the flag's (default) password.
    let mut server = server;
    for _ in 0..2 {
        let dir = server.stop().await;
        server = TestServer::start_in(dir, |_| {}).await;
        let mut root = server.client_with(Credentials::basic("root", "root-password"));
        let listed = root
            .admin
            .list_users(pb::ListUsersRequest {})
            .await
            .expect("list")
            .into_inner();
        assert_eq!(users(listed), ["root"], "the deleted admin came back");
        let status = server
            .client()
            .es
            .ping(pb::PingRequest {})
            .await
            .expect_err("the default admin login");
        assert_eq!(status.code(), Code::Unauthenticated);
    }
}

#[tokio::test]
async fn a2_an_exposed_first_start_refuses_the_default_admin_password() {
    let exposed = |dir: &tempfile::TempDir| {
        let mut config = cairn_server::ServeConfig::for_test(dir.path().join("data"));
        config.allow_default_password = false;
        config.listen = "0.0.0.0:0".parse().expect("address");
        config
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let Err(refused) = cairn_server::start(exposed(&dir)).await else {
        panic!("an exposed node started with the default admin password");
    };
    let message = refused.to_string();
    assert!(
        message.contains("non-loopback") && message.contains("--admin-password"),
        "{message}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "a refused start wrote nothing"
    );

    // On loopback (a laptop) the default is fine; so is an exposed node with a password.
    let laptop = TestServer::start_with(|c| c.allow_default_password = false).await;
    laptop.stop().await;
    let mut config = exposed(&dir);
    config.admin_password = "not-the-default".into();
    let server = cairn_server::start(config).await.expect("a password given");
    server.shutdown().await.expect("stop");
    // A later start is no first start: the flag no longer sets anything, and an upgrade
    // must not stop a running node.
    let server = cairn_server::start(exposed(&dir)).await.expect("a restart");
    server.shutdown().await.expect("stop");
}

async fn token_of(server: &TestServer, user: &str, password: &str) -> String {
    let response = server
        .client_with(Credentials::basic(user, password))
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("login");
    token_in(response.metadata())
}

/// The session token a response carries.
fn token_in(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get("x-auth-token")
        .expect("a token header")
        .to_str()
        .expect("ascii")
        .to_string()
}

#[tokio::test]
async fn a3_password_change_revokes_tokens() {
    let server = TestServer::start().await;
    let id = server.create_user("bob", "old-pw", &["OPERATIONS"]).await;
    let token = token_of(&server, "bob", "old-pw").await;
    let mut bob = server.client_with(Credentials::basic("bob", "old-pw"));
    let changed = bob
        .admin
        .change_password(pb::ChangePasswordRequest {
            user_id: id,
            current_password: "old-pw".into(),
            new_password: "new-pw".into(),
        })
        .await
        .expect("change own password")
        .into_inner();
    assert!(changed.success);
    let old_token = server
        .client_with(Credentials::token(&token))
        .es
        .ping(pb::PingRequest {})
        .await
        .expect_err("old token revoked");
    assert_eq!(old_token.code(), Code::Unauthenticated);
    let old_pw = bob
        .es
        .ping(pb::PingRequest {})
        .await
        .expect_err("old password");
    assert_eq!(old_pw.code(), Code::Unauthenticated);
    server
        .client_with(Credentials::basic("bob", "new-pw"))
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("new password works");
}

#[tokio::test]
async fn a3_user_deletion_revokes_tokens() {
    let server = TestServer::start().await;
    let id = server.create_user("carol", "pw", &["OPERATIONS"]).await;
    let token = token_of(&server, "carol", "pw").await;
    let deleted = server
        .client()
        .admin
        .delete_user(pb::DeleteUserRequest { user_id: id })
        .await
        .expect("delete")
        .into_inner();
    assert!(deleted.success);
    for credentials in [
        Credentials::token(&token),
        Credentials::basic("carol", "pw"),
    ] {
        let status = server
            .client_with(credentials)
            .es
            .ping(pb::PingRequest {})
            .await
            .expect_err("revoked");
        assert_eq!(status.code(), Code::Unauthenticated);
    }
}

#[tokio::test]
async fn a4_user_administration_errors() {
    let server = TestServer::start().await;
    let mut admin = server.client();
    let users = admin
        .admin
        .list_users(pb::ListUsersRequest {})
        .await
        .expect("list")
        .into_inner()
        .users;
    let admin_id = users[0].user_id.clone();

    let own = admin
        .admin
        .delete_user(pb::DeleteUserRequest {
            user_id: admin_id.clone(),
        })
        .await
        .expect_err("self");
    assert_eq!(own.code(), Code::FailedPrecondition);
    let unknown = admin
        .admin
        .delete_user(pb::DeleteUserRequest {
            user_id: "no-such-user".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code(), Code::NotFound);

    let dave = server.create_user("dave", "pw", &["ADMIN"]).await;
    let other = admin
        .admin
        .change_password(pb::ChangePasswordRequest {
            user_id: dave,
            current_password: "pw".into(),
            new_password: "x".into(),
        })
        .await
        .expect_err("someone else's password");
    assert_eq!(other.code(), Code::PermissionDenied);
    let wrong = admin
        .admin
        .change_password(pb::ChangePasswordRequest {
            user_id: admin_id,
            current_password: "not-changeit".into(),
            new_password: "x".into(),
        })
        .await
        .expect_err("wrong current");
    assert_eq!(wrong.code(), Code::Unauthenticated);
    // Nothing changed: the admin still logs in with the old password.
    server
        .client()
        .es
        .ping(pb::PingRequest {})
        .await
        .expect("unchanged");

    let count = admin
        .admin
        .get_user_count(pb::GetUserCountRequest {})
        .await
        .expect("count");
    assert_eq!(count.into_inner().count, 2);
    let valid = admin
        .admin
        .validate_credentials(pb::ValidateCredentialsRequest {
            username: "dave".into(),
            password: "pw".into(),
        })
        .await
        .expect("validate")
        .into_inner();
    assert!(valid.success);
    assert_eq!(valid.user.expect("user").username, "dave");
    let invalid = admin
        .admin
        .validate_credentials(pb::ValidateCredentialsRequest {
            username: "dave".into(),
            password: "no".into(),
        })
        .await
        .expect("validate")
        .into_inner();
    assert!(!invalid.success && invalid.user.is_none());
    let duplicate = admin
        .admin
        .create_user(pb::CreateUserRequest {
            name: "d".into(),
            username: "dave".into(),
            password: "pw".into(),
            roles: vec![],
        })
        .await
        .expect_err("duplicate username");
    assert_eq!(duplicate.code(), Code::AlreadyExists);
}

async fn rotate(server: &TestServer, grace_seconds: Option<u64>) -> cairn_v1::TokenKeyStatus {
    server
        .client()
        .tokens
        .rotate_key(cairn_v1::RotateKeyRequest { grace_seconds })
        .await
        .expect("rotate")
        .into_inner()
        .status
        .expect("a status")
}

async fn ping_with_token(server: &TestServer, token: &str) -> Result<String, Status> {
    server
        .client_with(Credentials::token(token))
        .es
        .ping(pb::PingRequest {})
        .await
        .map(|response| token_in(response.metadata()))
}

#[tokio::test]
async fn a1_a_rotated_token_key_honours_old_tokens_for_the_grace_period_only() {
    let server = TestServer::start().await;
    server.create_user("dave", "pw", &["OPERATIONS"]).await;
    let before = token_of(&server, "dave", "pw").await;
    let first = rotate(&server, Some(3600)).await;
    assert_eq!(first.generation, 1);
    assert_eq!(
        first.previous_accepted_until_unix_seconds - first.rotated_at_unix_seconds,
        3600
    );
    // In the grace period the old token works, and the response hands out a new-key one.
    let handed_out = ping_with_token(&server, &before)
        .await
        .expect("old token in the grace period");
    assert_ne!(
        handed_out, before,
        "the response carries a token of the new key"
    );
    assert_eq!(
        ping_with_token(&server, &handed_out)
            .await
            .expect("new key"),
        handed_out,
        "reused within the second"
    );
    // A rotation without grace (the key leaked) ends every token of the key it replaces.
    let second = rotate(&server, Some(0)).await;
    assert_eq!(second.generation, 2);
    assert_eq!(
        second.previous_accepted_until_unix_seconds,
        second.rotated_at_unix_seconds
    );
    for stale in [&before, &handed_out] {
        let refused = ping_with_token(&server, stale).await.expect_err("retired");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    let after = token_of(&server, "dave", "pw").await;
    ping_with_token(&server, &after).await.expect("current key");
    let status = server
        .client()
        .tokens
        .key_status(cairn_v1::KeyStatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .status;
    assert_eq!(status, Some(second));
}

#[tokio::test]
async fn a3_rotating_the_token_key_needs_admin_and_a_grace_of_at_most_a_week() {
    let server = TestServer::start().await;
    server.create_user("erin", "pw", &["OPERATIONS"]).await;
    let mut erin = server.client_with(Credentials::basic("erin", "pw"));
    let denied = erin
        .tokens
        .rotate_key(cairn_v1::RotateKeyRequest {
            grace_seconds: None,
        })
        .await
        .expect_err("not an admin");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let denied = erin
        .tokens
        .key_status(cairn_v1::KeyStatusRequest {})
        .await
        .expect_err("not an admin");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let too_long = server
        .client()
        .tokens
        .rotate_key(cairn_v1::RotateKeyRequest {
            grace_seconds: Some(7 * 24 * 3600 + 1),
        })
        .await
        .expect_err("longer than a week");
    assert_eq!(too_long.code(), Code::InvalidArgument, "{too_long:?}");
    assert!(too_long.message().contains("604800"), "{too_long:?}");
    // Nothing changed; the default grace is a day.
    let default = rotate(&server, None).await;
    assert_eq!(default.generation, 1, "the refused rotation left no trace");
    assert_eq!(
        default.previous_accepted_until_unix_seconds - default.rotated_at_unix_seconds,
        86_400
    );
}

#[tokio::test]
async fn a1_a_rotated_token_key_and_its_grace_period_survive_a_restart() {
    let server = TestServer::start().await;
    let before = token_of(&server, ADMIN.0, ADMIN.1).await;
    rotate(&server, Some(3600)).await;
    let after = token_of(&server, ADMIN.0, ADMIN.1).await;
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, |_| {}).await;
    for token in [&before, &after] {
        ping_with_token(&server, token)
            .await
            .expect("both keys still accepted after a restart");
    }
    rotate(&server, Some(0)).await;
    for token in [&before, &after] {
        assert_eq!(
            ping_with_token(&server, token)
                .await
                .expect_err("retired")
                .code(),
            Code::Unauthenticated
        );
    }
}
