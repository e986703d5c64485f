//! What the client's test files share: a real server to talk to.

/// A one-node server on an ephemeral port with the defaults a user gets (boundary
/// `default`, admin/changeit), and its data directory (kept until dropped).
pub async fn server() -> (cairn_server::RunningServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = cairn_server::ServeConfig::for_test(dir.path().join("data"));
    let server = cairn_server::start(config).await.expect("server starts");
    (server, dir)
}
