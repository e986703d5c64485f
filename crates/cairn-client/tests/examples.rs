//! The crate's examples, run against a real in-process Cairn server: they are the crate's
//! documentation, so they must keep working.

use std::time::Duration;

mod support;

use support::server;

#[allow(dead_code)]
#[path = "../examples/tour.rs"]
mod tour;

#[allow(dead_code)]
#[path = "../examples/transfers.rs"]
mod transfers;

#[tokio::test]
async fn the_tour_example_runs() {
    let (server, _dir) = server().await;
    let endpoint = format!("http://{}", server.grpc_addr);
    tokio::time::timeout(Duration::from_secs(60), tour::run(&endpoint))
        .await
        .expect("the tour finishes")
        .expect("the tour succeeds");
    // Twice against the same server: the tour is repeatable.
    tour::run(&endpoint).await.expect("the tour runs again");
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_transfers_example_runs() {
    let (server, _dir) = server().await;
    let endpoint = format!("http://{}", server.grpc_addr);
    let balances = tokio::time::timeout(Duration::from_secs(60), transfers::run(&endpoint))
        .await
        .expect("the transfers finish")
        .expect("the transfers succeed");
    assert_eq!(balances, (10, 190));
    server.shutdown().await.expect("clean shutdown");
}
