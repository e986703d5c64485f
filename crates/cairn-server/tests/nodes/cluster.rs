//! Replication, black-box: clusters of real `cairn` processes (see `support::cluster`),
//! driven through the Orisun API of any node, with kills, pauses and partitions of the
//! peer traffic.
//!
//! These tests live beside the binary rather than in the top-level `tests/` crate: cargo
//! hands the path of a freshly built `cairn` (`CARGO_BIN_EXE_cairn`) only to this
//! package's integration tests.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use futures::StreamExt;
use support::cluster::{Cluster, SECRET, WAIT, wait_for};
use support::{admin, http_get, metric};
use tonic::Code;
use tonic::transport::Channel;

const BOUNDARY: &str = "default";

pub(crate) async fn client(cluster: &Cluster, id: u64) -> EventStoreClient<Channel> {
    EventStoreClient::new(cluster.node(id).channel().await)
}

pub(crate) fn event(event_type: &str, data: &str) -> pb::EventToSave {
    pb::EventToSave {
        event_id: uuid::Uuid::now_v7().to_string(),
        event_type: event_type.to_string(),
        data: data.to_string(),
        metadata: String::new(),
    }
}

fn account(id: &str) -> pb::Query {
    pb::Query {
        criteria: vec![pb::Criterion {
            tags: vec![pb::Tag {
                key: "account".into(),
                value: id.into(),
            }],
        }],
    }
}

fn observed(query: pb::Query, commit: i64, prepare: i64) -> pb::ConsistencyObservation {
    pb::ConsistencyObservation {
        query: Some(query),
        position: Some(pb::Position {
            commit_position: commit,
            prepare_position: prepare,
        }),
    }
}

pub(crate) async fn save(
    es: &mut EventStoreClient<Channel>,
    events: Vec<pb::EventToSave>,
    consistency: Vec<pb::ConsistencyObservation>,
) -> Result<pb::WriteResult, tonic::Status> {
    es.save_events_v2(admin(pb::SaveEventsV2Request {
        boundary: BOUNDARY.into(),
        events,
        consistency,
    }))
    .await
    .map(|r| r.into_inner())
}

/// Every event of the boundary, oldest first, in pages of the GetEvents limit.
pub(crate) async fn all_events(
    es: &mut EventStoreClient<Channel>,
) -> Result<Vec<pb::Event>, tonic::Status> {
    let mut events: Vec<pb::Event> = Vec::new();
    loop {
        let from_position = events.last().and_then(|e| e.position);
        let mut page = es
            .get_events(admin(pb::GetEventsRequest {
                boundary: BOUNDARY.into(),
                count: 10_000,
                direction: pb::Direction::Asc as i32,
                from_position,
                ..Default::default()
            }))
            .await?
            .into_inner()
            .events;
        if let Some(last) = events.last() {
            // `from_position` is inclusive: the page starts with the last event already read.
            assert_eq!(page.first().map(|e| &e.event_id), Some(&last.event_id));
            page.remove(0);
        }
        if page.is_empty() {
            return Ok(events);
        }
        events.extend(page);
    }
}

pub(crate) fn others(ids: &[u64], leader: u64) -> Vec<u64> {
    ids.iter().copied().filter(|&id| id != leader).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_takes_writes_and_every_node_reads_them_at_once() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let followers = others(&cluster.ids(), leader);
    let (f1, f2) = (followers[0], followers[1]);

    // A write through one follower is visible on the other right after the ack: the
    // second follower's read waits for the leader's read index.
    let mut via_f1 = client(&cluster, f1).await;
    let mut via_f2 = client(&cluster, f2).await;
    let mut via_leader = client(&cluster, leader).await;
    for i in 0..20 {
        let written = save(
            &mut via_f1,
            vec![event("Deposited", &format!(r#"{{"account":"a","n":{i}}}"#))],
            vec![],
        )
        .await
        .expect("a follower takes the write");
        let events = all_events(&mut via_f2)
            .await
            .expect("read on the other follower");
        let last = events.last().expect("the write is there");
        assert_eq!(
            last.position.as_ref().map(|p| p.commit_position),
            written.log_position.as_ref().map(|p| p.commit_position),
            "write {i}: the other follower returns it right after the ack"
        );
    }

    // The leader planned those writes (pre-execution): every replica wrote the planned rows
    // rather than checking and building them again, and every replica decided alike.
    let addrs: Vec<_> = cluster
        .ids()
        .iter()
        .map(|id| cluster.node(*id).http_addr)
        .collect();
    let held = wait_for("every replica to apply the planned writes alike", || {
        let addrs = addrs.clone();
        async move {
            let mut counts = Vec::new();
            for addr in addrs {
                let metrics = http_get(addr, "/metrics").await;
                let series = |result| {
                    let name =
                        format!("cairn_raft_planned_entries_applied_total{{result=\"{result}\"}}");
                    metrics.contains(&name).then(|| metric(&metrics, &name))
                };
                counts.push((
                    series("held").unwrap_or(0.0),
                    series("stale").unwrap_or(0.0),
                ));
            }
            counts.windows(2).all(|w| w[0] == w[1]).then(|| counts[0])
        }
    })
    .await;
    assert!(
        held.0 >= 15.0,
        "most of 20 one-at-a-time writes are planned and held (held, stale): {held:?}"
    );

    // A CCC conflict found by the leader comes back through a follower unchanged.
    let stale = vec![observed(account("a"), -1, -1)];
    let on_leader = save(
        &mut via_leader,
        vec![event("Opened", r#"{"account":"a"}"#)],
        stale.clone(),
    )
    .await
    .expect_err("the context moved");
    let on_follower = save(
        &mut via_f2,
        vec![event("Opened", r#"{"account":"a"}"#)],
        stale,
    )
    .await
    .expect_err("the context moved");
    assert_eq!(on_leader.code(), Code::AlreadyExists);
    assert_eq!(on_follower.code(), on_leader.code());
    assert_eq!(on_follower.message(), on_leader.message());

    // Catalog changes made on a follower are read back on another.
    let mut admin_f1 =
        cairn_proto::orisun::admin_client::AdminClient::new(cluster.node(f1).channel().await);
    let mut admin_f2 =
        cairn_proto::orisun::admin_client::AdminClient::new(cluster.node(f2).channel().await);
    admin_f1
        .create_boundary(admin(pb::CreateBoundaryRequest {
            name: "orders".into(),
            ..Default::default()
        }))
        .await
        .expect("create a boundary on a follower");
    let got = admin_f2
        .get_boundary(admin(pb::GetBoundaryRequest {
            name: "orders".into(),
        }))
        .await
        .expect("the other follower has it");
    assert_eq!(
        got.into_inner().boundary.map(|b| b.name).as_deref(),
        Some("orders")
    );

    // Status through the CLI, as an operator would ask for it.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["cluster", "status", "--json", "--endpoint"])
        .arg(cluster.member(f2).peer_addr().to_string())
        .args(["--cluster-secret", SECRET])
        .output()
        .expect("cairn cluster status");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(status["node_id"], f2);
    assert_eq!(status["role"], "follower");
    assert_eq!(status["leader_id"], leader);
    assert_eq!(status["members"].as_array().map(Vec::len), Some(3));
    let default = status["boundaries"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == BOUNDARY).cloned())
        .expect("the default boundary");
    assert!(default["commit_position"].as_i64() > Some(0));
    // Without the secret the peer port refuses.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["cluster", "status", "--endpoint"])
        .arg(cluster.member(f2).peer_addr().to_string())
        .args(["--cluster-secret", "not-the-cluster-secret"])
        .output()
        .expect("cairn cluster status");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("wrong cluster secret"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_subscription_gets_every_event_in_order_across_a_leader_change() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let followers = others(&cluster.ids(), leader);
    let (watcher, writer) = (followers[0], followers[1]);

    let mut stream = client(&cluster, watcher)
        .await
        .catch_up_subscribe_to_events(admin(pb::CatchUpSubscribeToEventStoreRequest {
            boundary: BOUNDARY.into(),
            subscriber_name: "projector".into(),
            after_position: Some(pb::Position {
                commit_position: -1,
                prepare_position: -1,
            }),
            query: None,
        }))
        .await
        .expect("subscribe on a follower")
        .into_inner();

    let mut written = Vec::new();
    let mut via_writer = client(&cluster, writer).await;
    for i in 0..15 {
        let e = event("Tick", &format!(r#"{{"n":{i}}}"#));
        written.push(e.event_id.clone());
        save(&mut via_writer, vec![e], vec![]).await.expect("write");
    }
    cluster.kill(leader);
    // Writes resume once the two survivors have elected a leader (calls meanwhile wait
    // for it, or answer UNAVAILABLE and are retried here: nothing was applied).
    for i in 15..30 {
        let e = event("Tick", &format!(r#"{{"n":{i}}}"#));
        written.push(e.event_id.clone());
        let event_id = e.event_id.clone();
        let mut attempt = Some(e);
        while let Some(e) = attempt.take() {
            match save(&mut via_writer, vec![e.clone()], vec![]).await {
                Ok(_) => {}
                Err(status) if status.code() == Code::Unavailable => {
                    // Ambiguous: only retry if it did not land.
                    let landed = all_events(&mut via_writer)
                        .await
                        .map(|events| events.iter().any(|x| x.event_id == event_id))
                        .unwrap_or(false);
                    if !landed {
                        attempt = Some(e);
                    }
                }
                Err(status) => panic!("write {i}: {status}"),
            }
        }
    }
    let mut received = Vec::new();
    while received.len() < written.len() {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the subscription keeps delivering")
            .expect("the stream stays open")
            .expect("an event");
        received.push(next.event_id);
    }
    assert_eq!(received, written, "every event once, in commit order");
    cluster.restart(leader).await;
}

/// A consumer reconnects to a follower that lags behind its checkpoint (review M4): the
/// subscription must start after the position it gives, not at the follower's older head.
/// Before the read barrier, the start was clamped to the local head and, as the follower
/// caught up, events the consumer already had were delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_on_a_lagging_follower_starts_after_the_given_position() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let lagging = others(&cluster.ids(), leader)[0];
    // The follower hears nothing from the leader, yet reaches it: its writes (the
    // subscription's lease) are forwarded and commit while its own state stays behind.
    cluster.cut(leader, lagging);
    let mut via_leader = client(&cluster, leader).await;
    let mut checkpoint = None;
    for i in 0..100 {
        let written = save(
            &mut via_leader,
            vec![event("Tick", &format!(r#"{{"n":{i}}}"#))],
            vec![],
        )
        .await
        .expect("write");
        checkpoint = written.log_position;
    }
    // While it lags, the follower cannot catch up to the leader's read index: the call is
    // UNAVAILABLE (before the fix it started at once from its stale head). Once the link
    // is back, it starts after the checkpoint.
    let mut on_lagging = client(&cluster, lagging).await;
    let mut healed = false;
    let mut stream = loop {
        let opened = on_lagging
            .catch_up_subscribe_to_events(admin(pb::CatchUpSubscribeToEventStoreRequest {
                boundary: BOUNDARY.into(),
                subscriber_name: "projector".into(),
                after_position: checkpoint,
                query: None,
            }))
            .await;
        match opened {
            Ok(stream) => break stream.into_inner(),
            Err(status) if status.code() == Code::Unavailable => {
                if healed {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                cluster.heal();
                healed = true;
            }
            Err(status) => panic!("subscribe on the lagging follower: {status}"),
        }
    };
    cluster.heal();
    let after = event("Tick", r#"{"n":100}"#);
    // The follower campaigned while it heard nothing: the healed link may bring an
    // election, and a write meanwhile may be UNAVAILABLE (only the first delivered event
    // is checked, so a retry that lands twice does not matter).
    let mut writer = client(&cluster, lagging).await;
    loop {
        match save(&mut writer, vec![after.clone()], vec![]).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("write after the checkpoint: {status}"),
        }
    }
    let first = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the subscription delivers")
        .expect("the stream stays open")
        .expect("an event");
    assert_eq!(
        first.event_id, after.event_id,
        "the first event delivered is the one after the checkpoint, not one the consumer had"
    );
}

/// Sends `request` to the lagging node until it is answered other than UNAVAILABLE,
/// healing the cut links after the first UNAVAILABLE (the node cannot catch up while cut).
async fn until_answered<T, F, Fut>(cluster: &Cluster, what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let started = tokio::time::Instant::now();
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(status) if status.code() == Code::Unavailable => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{what}: {status}"
                );
                cluster.heal();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("{what}: {status}"),
        }
    }
}

/// Review L9: a boundary and a user created through the leader are found on a node that
/// has not applied them yet. Before the fix the lagging node refused the write at once
/// (FAILED_PRECONDITION for the boundary, UNAUTHENTICATED for the user) from its stale
/// catalog; now it passes the read barrier and looks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_finds_a_boundary_and_a_user_created_elsewhere() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let lagging = others(&cluster.ids(), leader)[0];
    let mut admin_on_leader = AdminClient::new(cluster.node(leader).channel().await);
    let mut on_lagging = client(&cluster, lagging).await;

    cluster.cut(leader, lagging);
    admin_on_leader
        .create_boundary(admin(pb::CreateBoundaryRequest {
            name: "late_orders".into(),
            ..Default::default()
        }))
        .await
        .expect("create a boundary through the leader");
    let write = |es: &mut EventStoreClient<Channel>,
                 request: tonic::Request<pb::SaveEventsV2Request>| {
        let mut es = es.clone();
        async move { es.save_events_v2(request).await }
    };
    let to_late_orders = || pb::SaveEventsV2Request {
        boundary: "late_orders".into(),
        events: vec![event("Placed", "{}")],
        ..Default::default()
    };
    until_answered(&cluster, "write to a boundary created elsewhere", || {
        write(&mut on_lagging, admin(to_late_orders()))
    })
    .await;

    cluster.cut(leader, lagging);
    support::create_user(cluster.node(leader), "late", "late-password").await;
    until_answered(&cluster, "write as a user created elsewhere", || {
        write(
            &mut on_lagging,
            support::with_basic(to_late_orders(), "late", "late-password"),
        )
    })
    .await;
    // A wrong password is still refused, after the same look.
    let refused = write(
        &mut on_lagging,
        support::with_basic(to_late_orders(), "late", "wrong-password"),
    )
    .await
    .expect_err("a wrong password");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused}");
}

/// Review L10: a node removed from the cluster that keeps running applies nothing more,
/// yet its lease renewals went on succeeding through the leader, so its subscriptions
/// stayed open and silent for ever. They end now, UNAVAILABLE, at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_ends_its_subscriptions() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    cluster.join(4, leader, &[]).await;
    agreed_membership(&cluster, leader, &[1, 2, 3], &[4]).await;
    let mut stream = client(&cluster, 4)
        .await
        .catch_up_subscribe_to_events(admin(pb::CatchUpSubscribeToEventStoreRequest {
            boundary: BOUNDARY.into(),
            subscriber_name: "projector".into(),
            after_position: None,
            query: None,
        }))
        .await
        .expect("subscribe on the learner")
        .into_inner();
    let mut via_leader = client(&cluster, leader).await;
    save(&mut via_leader, vec![event("Before", "{}")], vec![])
        .await
        .expect("write");
    let first = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the learner delivers")
        .expect("open")
        .expect("an event");
    assert_eq!(first.event_type, "Before");

    cluster.cli(leader, &["remove", "4"]);
    save(&mut via_leader, vec![event("After", "{}")], vec![])
        .await
        .expect("write after the removal");
    let ended = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the subscription on the removed node ends instead of staying silent");
    match ended {
        Some(Err(status)) => {
            assert_eq!(status.code(), Code::Unavailable, "{status}");
            assert!(
                status.message().contains("removed from the cluster"),
                "{status}"
            );
        }
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
}

const INSTALL_ROUNDS: u64 = 10;
const SEED_BATCHES: u64 = 20;

/// An unconditional write, retried while the cluster elects (a thawed follower's election
/// timer has long expired: it campaigns, and the leader steps down). A retry may store
/// the event twice, which the callers do not mind: they compare replicas, not writes.
async fn save_retrying(es: &mut EventStoreClient<Channel>, e: pb::EventToSave) {
    loop {
        match save(es, vec![e.clone()], vec![]).await {
            Ok(_) => return,
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("write: {status}"),
        }
    }
}

/// Hole 2 of the replication review: a snapshot install rewrote a follower's state in
/// place while its subscriptions read pages, so a page read mid-install could send the
/// cursor back to 0 (everything again) or past events (a gap). Ten times, the follower
/// is frozen while the leader moves well past its purged log, thawed, and installs a
/// snapshot under writes; its subscribers must receive exactly the commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_on_a_node_installing_snapshots_under_load_get_every_event_once() {
    let snapshots = ["--snapshot-every-entries", "50", "--raft-log-kept", "10"];
    let cluster = Cluster::start(3, &snapshots).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let lagging = others(&cluster.ids(), leader)[0];
    let mut via_leader = client(&cluster, leader).await;
    // A state large enough that an install takes a while, and a backlog the slow
    // subscriber is still paging through while the installs happen.
    for batch in 0..SEED_BATCHES {
        let events = (0..1_000)
            .map(|i| event("Seed", &format!(r#"{{"batch":{batch},"n":{i}}}"#)))
            .collect();
        save(&mut via_leader, events, vec![]).await.expect("seed");
    }

    let stop = tokio_util::sync::CancellationToken::new();
    let mut subscribers = Vec::new();
    // A consumer that keeps up, and one that takes a millisecond per event: always behind,
    // its subscription reads page after page from storage while installs happen.
    for (name, pause) in [("live", None), ("slow", Some(Duration::from_millis(1)))] {
        let mut es = client(&cluster, lagging).await;
        let mut stream = es
            .catch_up_subscribe_to_events(admin(pb::CatchUpSubscribeToEventStoreRequest {
                boundary: BOUNDARY.into(),
                subscriber_name: name.into(),
                after_position: Some(pb::Position {
                    commit_position: 0,
                    prepare_position: 0,
                }),
                query: None,
            }))
            .await
            .expect("subscribe on the lagging follower")
            .into_inner();
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        subscribers.push(got.clone());
        tokio::spawn(async move {
            while let Some(next) = stream.next().await {
                match next {
                    Ok(event) => got.lock().expect("lock").push(event.event_id),
                    Err(status) => panic!("subscription {name} failed: {status}"),
                }
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
            }
        });
    }
    // Writes all along, so installs happen while the leader moves on.
    let background = {
        let (mut es, stop) = (client(&cluster, leader).await, stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                save_retrying(&mut es, event("Load", &format!(r#"{{"n":{n}}}"#))).await;
                n += 1;
            }
        })
    };
    let installs = |exposition: &str| metric(exposition, "cairn_raft_snapshot_installs_total");
    for round in 0..INSTALL_ROUNDS {
        let before = installs(&http_get(cluster.node(lagging).http_addr, "/metrics").await);
        cluster.pause(lagging);
        for i in 0..150 {
            let data = format!(r#"{{"round":{round},"n":{i}}}"#);
            save_retrying(&mut via_leader, event("Tick", &data)).await;
        }
        cluster.resume(lagging);
        wait_for(
            &format!("node {lagging} to install snapshot {round}"),
            || async {
                let now = installs(&http_get(cluster.node(lagging).http_addr, "/metrics").await);
                (now > before).then_some(())
            },
        )
        .await;
    }
    stop.cancel();
    background.await.expect("background writer");
    caught_up(&cluster, lagging, leader).await;
    let committed: Vec<String> = all_events(&mut via_leader)
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    for got in &subscribers {
        // The slow consumer takes tens of seconds: wait while it makes progress.
        let mut last = 0;
        loop {
            let now = got.lock().expect("lock").len();
            if now >= committed.len() {
                break;
            }
            assert!(
                now > last,
                "a subscription stalled at {now} of {} events",
                committed.len()
            );
            last = now;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let got = got.lock().expect("lock").clone();
        let delivered: BTreeSet<&String> = got.iter().collect();
        let repeats = got.len() - delivered.len();
        let gaps = committed
            .iter()
            .filter(|id| !delivered.contains(id))
            .count();
        assert_eq!(
            (gaps, repeats),
            (0, 0),
            "gaps and repeats in a subscription"
        );
        assert!(
            got == committed,
            "a subscription delivered events out of commit order"
        );
    }
}

/// A leadership transfer whose caller gives up (review finding 8): the leader stops its
/// heartbeats for the hand-over, and before the fix only a transfer that finished turned
/// them back on. A cancelled call left the group silent, and the other follower elected a
/// new leader after its election timeout, again and again on an idle cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leadership_transfer_leaves_the_leader_heartbeating() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let followers = others(&cluster.ids(), leader);
    let (target, bystander) = (followers[0], followers[1]);
    let last = cluster.status(leader).await.expect("status").last_log_index;
    cluster.applied_everywhere(&[1, 2, 3], last).await;
    let term = cluster.status(leader).await.expect("status").term;
    // The target would never win: it is frozen.
    cluster.pause(target);

    let mut request = support::cluster::with_secret(cairn_proto::cairn_v1::TransferLeaderRequest {
        node_id: target,
    });
    // Well inside the bystander's election timeout, so only a leader that stays silent
    // after the cancel lets it campaign.
    request.set_timeout(Duration::from_millis(200));
    let cancelled = cluster
        .cluster_api(leader)
        .await
        .transfer_leader(request)
        .await
        .expect_err("the transfer cannot finish within 200 ms");
    assert!(
        matches!(cancelled.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{cancelled}"
    );

    // Several election timeouts: the bystander keeps hearing from the leader.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        let seen = cluster.status(bystander).await.expect("status");
        assert_eq!(
            (seen.term, seen.leader_id),
            (term, leader),
            "the bystander stopped hearing from the leader after the cancelled transfer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.resume(target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_serving_and_the_majority_carries_on() {
    partitioned_leader_stops_serving(Cluster::start(3, &[]).await).await;
}

/// The partition test on `cluster`, three nodes (plaintext or TLS peers).
pub async fn partitioned_leader_stops_serving(cluster: Cluster) {
    let old = cluster.leader_among(&[1, 2, 3]).await;
    let majority = others(&cluster.ids(), old);
    let mut via_old = client(&cluster, old).await;
    save(&mut via_old, vec![event("Before", r#"{"k":"v"}"#)], vec![])
        .await
        .expect("a write before the partition");

    cluster.isolate(old);
    let new = cluster.leader_among(&majority).await;
    assert_ne!(new, old);
    let mut via_majority = client(&cluster, majority[0]).await;
    let during = save(
        &mut via_majority,
        vec![event("During", r#"{"k":"v"}"#)],
        vec![],
    )
    .await
    .expect("the majority takes writes");
    // The cut-off node can neither commit nor prove a read is current.
    let write = save(&mut via_old, vec![event("Lost", r#"{"k":"v"}"#)], vec![])
        .await
        .expect_err("no quorum behind the old leader");
    assert_eq!(write.code(), Code::Unavailable, "{write:?}");
    let read = all_events(&mut via_old)
        .await
        .expect_err("no linearizable read");
    assert_eq!(read.code(), Code::Unavailable, "{read:?}");

    cluster.heal();
    // The old leader rejoins as a follower and serves the majority's write.
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    assert_ne!(leader, old);
    let events = wait_for("the healed node to serve reads", || {
        let mut via_old = via_old.clone();
        async move { all_events(&mut via_old).await.ok() }
    })
    .await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    // The cut-off write never reached a majority: the new leader's log replaced it.
    assert_eq!(types, ["Before", "During"]);
    assert_eq!(events.last().and_then(|e| e.position), during.log_position);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_leader_kills_and_pauses_exactly_once() {
    survive_leader_kills_and_pauses(Cluster::start(3, &[]).await).await;
}

/// The failover test on `cluster`, three nodes (plaintext or TLS peers): writes through
/// every node while the leader is killed, frozen, killed again; every acknowledged write
/// ends on every node exactly once.
pub async fn survive_leader_kills_and_pauses(mut cluster: Cluster) {
    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    let mut ambiguous: BTreeSet<String> = BTreeSet::new();
    for round in 0..3 {
        let leader = cluster.leader_among(&cluster.ids()).await;
        let mut writers = Vec::new();
        for &id in &cluster.ids() {
            let mut es = client(&cluster, id).await;
            writers.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut unknown = Vec::new();
                for i in 0..30 {
                    let e = event("Credited", &format!(r#"{{"account":"n{id}","i":{i}}}"#));
                    let event_id = e.event_id.clone();
                    match save(&mut es, vec![e], vec![]).await {
                        Ok(_) => acked.push(event_id),
                        // Its node died or lost its leader mid-call: the outcome is
                        // unknown (UNAVAILABLE, or a transport error).
                        Err(status) => {
                            assert_ne!(status.code(), Code::AlreadyExists, "{status:?}");
                            unknown.push(event_id);
                        }
                    }
                }
                (acked, unknown)
            }));
        }
        // Mid-stream, the leader is killed (rounds 0 and 2) or frozen (round 1).
        tokio::time::sleep(Duration::from_millis(300)).await;
        if round == 1 {
            cluster.pause(leader);
            let survivors = others(&cluster.ids(), leader);
            cluster.leader_among(&survivors).await;
            cluster.resume(leader);
        } else {
            cluster.kill(leader);
        }
        for writer in writers {
            let (acked, unknown) = writer.await.expect("writer");
            acknowledged.extend(acked);
            ambiguous.extend(unknown);
        }
        if cluster.member(leader).node.is_none() {
            cluster.restart(leader).await;
        }
    }
    // Every node ends with every acknowledged write exactly once, and the same log.
    let leader = cluster.leader_among(&cluster.ids()).await;
    let index = cluster.status(leader).await.expect("status").last_log_index;
    cluster.applied_everywhere(&cluster.ids(), index).await;
    let mut logs = BTreeMap::new();
    for id in cluster.ids() {
        let events = all_events(&mut client(&cluster, id).await)
            .await
            .expect("read");
        let mut seen = BTreeSet::new();
        for e in &events {
            assert!(
                seen.insert(e.event_id.clone()),
                "node {id}: {} twice",
                e.event_id
            );
        }
        for id_ in &acknowledged {
            assert!(
                seen.contains(id_),
                "node {id} lost acknowledged write {id_}"
            );
        }
        assert!(
            seen.iter()
                .all(|e| acknowledged.contains(e) || ambiguous.contains(e))
        );
        logs.insert(
            id,
            events
                .iter()
                .map(|e| e.event_id.clone())
                .collect::<Vec<_>>(),
        );
    }
    let first = logs.values().next().expect("a log").clone();
    assert!(logs.values().all(|l| *l == first), "replicas differ");
    assert!(
        acknowledged.len() >= 30,
        "only {} writes acknowledged",
        acknowledged.len()
    );
}

async fn voters_and_learners(cluster: &Cluster, id: u64) -> (Vec<u64>, Vec<u64>) {
    let status = cluster.status(id).await.expect("status");
    let pick = |voter: bool| {
        status
            .members
            .iter()
            .filter(|m| m.voter == voter)
            .map(|m| m.node_id)
            .collect()
    };
    (pick(true), pick(false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_grows_from_three_to_five_voters_and_shrinks_back() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let mut via_leader = client(&cluster, leader).await;
    for i in 0..10 {
        save(
            &mut via_leader,
            vec![event("Before", &format!(r#"{{"i":{i}}}"#))],
            vec![],
        )
        .await
        .expect("write");
    }
    // Two new nodes join, one with --join to a member, one as a StatefulSet pod beyond the
    // formation members would (their --initial-members, its own address); both arrive as
    // learners and serve linearizable reads of everything written before they came.
    cluster.join(4, 2, &[]).await;
    cluster.join_as_later_member(5, &[]).await;
    agreed_membership(&cluster, leader, &[1, 2, 3], &[4, 5]).await;
    let on_learner = all_events(&mut client(&cluster, 4).await)
        .await
        .expect("read");
    assert_eq!(on_learner.len(), 10, "the learner has the log");

    let promoted = cluster.cli(1, &["promote", "4"]);
    assert!(promoted.contains("node 4 is a voter"), "{promoted}");
    cluster.cli(5, &["promote", "5"]);
    agreed_membership(&cluster, 4, &[1, 2, 3, 4, 5], &[]).await;

    // Five voters survive two failures, the leader among them.
    let leader = cluster.leader_among(&cluster.ids()).await;
    let second = if leader == 1 { 2 } else { 1 };
    cluster.kill(leader);
    cluster.kill(second);
    let survivors = others(&others(&cluster.ids(), leader), second);
    cluster.leader_among(&survivors).await;
    let mut via_survivor = client(&cluster, survivors[0]).await;
    save(&mut via_survivor, vec![event("WithThree", "{}")], vec![])
        .await
        .expect("three of five take writes");
    cluster.restart(leader).await;
    cluster.restart(second).await;

    // Back to three: voters leave one at a time, and the cluster keeps its quorum.
    cluster.cli(1, &["remove", "5"]);
    cluster.cli(2, &["remove", "4"]);
    cluster.kill(4);
    cluster.kill(5);
    agreed_membership(&cluster, 1, &[1, 2, 3], &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let follower = others(&[1, 2, 3], leader)[0];
    cluster.kill(follower);
    let mut via_leader = client(&cluster, leader).await;
    save(&mut via_leader, vec![event("AfterShrink", "{}")], vec![])
        .await
        .expect("two of three take writes: removed nodes no longer count");
    let removing_a_stranger = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["cluster", "remove", "9", "--endpoint"])
        .arg(cluster.member(leader).peer_addr().to_string())
        .args(["--cluster-secret", SECRET])
        .output()
        .expect("cairn cluster");
    assert!(!removing_a_stranger.status.success());
    assert!(
        String::from_utf8_lossy(&removing_a_stranger.stderr).contains("node 9 is not a member"),
        "{}",
        String::from_utf8_lossy(&removing_a_stranger.stderr)
    );
}

/// Waits until node `id` has applied everything node `reference` had committed when asked.
async fn caught_up(cluster: &Cluster, id: u64, reference: u64) {
    let target = cluster
        .status(reference)
        .await
        .expect("status")
        .committed_index;
    cluster.applied_everywhere(&[id], target).await;
}

/// Waits until node `id` has applied the membership with these voters and learners (a
/// change is acknowledged once committed; each node applies it in its own time).
async fn agreed_membership(cluster: &Cluster, id: u64, voters: &[u64], learners: &[u64]) {
    let want = (voters.to_vec(), learners.to_vec());
    wait_for(
        &format!("node {id} to apply the membership {want:?}"),
        || {
            let want = want.clone();
            async move { (voters_and_learners(cluster, id).await == want).then_some(()) }
        },
    )
    .await;
}

const SEEDED_EVENTS: usize = 100_000;
const SEED_BATCH: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_grows_under_writes_past_a_purged_log_and_replaces_a_wiped_node() {
    // A snapshot every 50 entries with 10 kept behind it: newcomers find the log long purged.
    let snapshots = ["--snapshot-every-entries", "50", "--raft-log-kept", "10"];
    let mut cluster = Cluster::start(3, &snapshots).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let mut seeders = Vec::new();
    for lane in 0..4 {
        let mut es = client(&cluster, leader).await;
        seeders.push(tokio::spawn(async move {
            for batch in (lane..SEEDED_EVENTS / SEED_BATCH).step_by(4) {
                let events = (0..SEED_BATCH)
                    .map(|i| event("Seeded", &format!(r#"{{"n":{}}}"#, batch * SEED_BATCH + i)))
                    .collect();
                save(&mut es, events, vec![]).await.expect("seed");
            }
        }));
    }
    for seeder in seeders {
        seeder.await.expect("seeder");
    }

    // Writes keep coming through every original member while the cluster grows.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut writers = Vec::new();
    for id in [1, 2, 3] {
        let (mut es, stop) = (client(&cluster, id).await, stop.clone());
        writers.push(tokio::spawn(async move {
            let (mut acknowledged, mut unsure) = (Vec::new(), Vec::new());
            while !stop.is_cancelled() {
                let e = event("WhileGrowing", &format!(r#"{{"via":{id}}}"#));
                let event_id = e.event_id.clone();
                match save(&mut es, vec![e], vec![]).await {
                    Ok(_) => acknowledged.push(event_id),
                    // A write caught in a membership change may or may not have committed.
                    Err(status) if status.code() == Code::Unavailable => unsure.push(event_id),
                    Err(status) => panic!("write via node {id}: {status}"),
                }
            }
            (acknowledged, unsure)
        }));
    }
    cluster.join(4, 1, &snapshots).await;
    cluster.join(5, 2, &snapshots).await;
    for newcomer in [4, 5] {
        caught_up(&cluster, newcomer, leader).await;
        let metrics = http_get(cluster.node(newcomer).http_addr, "/metrics").await;
        assert!(
            metric(&metrics, "cairn_raft_snapshot_installs_total") >= 1.0,
            "node {newcomer} caught up from a snapshot, the log it needed being purged"
        );
    }
    cluster.cli(3, &["promote", "4"]);
    cluster.cli(4, &["promote", "5"]);
    agreed_membership(&cluster, 5, &[1, 2, 3, 4, 5], &[]).await;
    stop.cancel();
    let (mut acknowledged, mut unsure) = (BTreeSet::new(), BTreeSet::new());
    for writer in writers {
        let (acked, maybe) = writer.await.expect("writer");
        acknowledged.extend(acked);
        unsure.extend(maybe);
    }
    assert!(
        acknowledged.len() >= 10,
        "writes ran while the cluster grew: {} acknowledged",
        acknowledged.len()
    );

    // Every replica holds the same events, byte for byte; each acknowledged write once.
    let leader = cluster.leader_among(&cluster.ids()).await;
    caught_up(&cluster, leader, leader).await;
    let reference = all_events(&mut client(&cluster, leader).await)
        .await
        .expect("read");
    let seeded = reference
        .iter()
        .filter(|e| e.event_type == "Seeded")
        .count();
    assert_eq!(seeded, SEEDED_EVENTS);
    let while_growing: Vec<&String> = reference
        .iter()
        .filter(|e| e.event_type == "WhileGrowing")
        .map(|e| &e.event_id)
        .collect();
    let present: BTreeSet<&String> = while_growing.iter().copied().collect();
    assert_eq!(present.len(), while_growing.len(), "no write applied twice");
    for id in &acknowledged {
        assert!(present.contains(id), "acknowledged write {id} is missing");
    }
    for id in &present {
        assert!(
            acknowledged.contains(*id) || unsure.contains(*id),
            "{id} was never written"
        );
    }
    for id in others(&cluster.ids(), leader) {
        let events = all_events(&mut client(&cluster, id).await)
            .await
            .expect("read");
        assert!(events == reference, "node {id} differs from the leader");
    }

    // Back to three: the newcomers leave, then stop cleanly.
    cluster.cli(1, &["remove", "5"]);
    cluster.cli(2, &["remove", "4"]);
    for removed in [4, 5] {
        let node = cluster
            .members
            .get_mut(&removed)
            .and_then(|m| m.node.take())
            .expect("runs");
        assert!(
            node.terminate().await.success(),
            "node {removed} stops cleanly"
        );
    }
    agreed_membership(&cluster, 1, &[1, 2, 3], &[]).await;

    // A member loses its disk: it is removed, wiped, and joins again under its own id.
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let lost = others(&[1, 2, 3], leader)[0];
    cluster.kill(lost);
    cluster.cli(leader, &["remove", &lost.to_string()]);
    cluster.rejoin_wiped(lost, leader, &snapshots).await;
    caught_up(&cluster, lost, leader).await;
    let metrics = http_get(cluster.node(lost).http_addr, "/metrics").await;
    assert!(metric(&metrics, "cairn_raft_snapshot_installs_total") >= 1.0);
    cluster.cli(leader, &["promote", &lost.to_string()]);
    agreed_membership(&cluster, lost, &[1, 2, 3], &[]).await;
    let mut via_replaced = client(&cluster, lost).await;
    let last = event("AfterReplace", "{}");
    let last_id = last.event_id.clone();
    save(&mut via_replaced, vec![last], vec![])
        .await
        .expect("the replaced node takes writes");
    for id in [1, 2, 3] {
        let events = all_events(&mut client(&cluster, id).await)
            .await
            .expect("read");
        assert_eq!(events.len(), reference.len() + 1, "node {id}");
        assert!(
            events[..reference.len()] == reference[..],
            "node {id} kept the history"
        );
        assert_eq!(events.last().map(|e| &e.event_id), Some(&last_id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_the_purged_log_catches_up_from_a_snapshot() {
    let mut cluster = Cluster::start(
        3,
        &["--snapshot-every-entries", "20", "--raft-log-kept", "5"],
    )
    .await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let behind = others(&cluster.ids(), leader)[0];
    cluster.kill(behind);
    // One entry per write (sequential), far more than the log keeps behind a snapshot.
    let mut via_leader = client(&cluster, leader).await;
    for i in 0..120 {
        save(
            &mut via_leader,
            vec![event("Written", &format!(r#"{{"i":{i}}}"#))],
            vec![],
        )
        .await
        .expect("write");
    }
    cluster.restart(behind).await;
    let events = all_events(&mut client(&cluster, behind).await)
        .await
        .expect("a linearizable read on the node that was behind");
    assert_eq!(events.len(), 120);
    let metrics = http_get(cluster.node(behind).http_addr, "/metrics").await;
    let installs = metric(&metrics, "cairn_raft_snapshot_installs_total");
    assert!(
        installs >= 1.0,
        "the node caught up by snapshot install:\n{metrics}"
    );
    let sent = metric(
        &http_get(cluster.node(leader).http_addr, "/metrics").await,
        "cairn_raft_snapshot_chunks_sent_total",
    );
    assert!(sent >= 1.0, "the leader sent a snapshot");
    // And it follows the log from there.
    save(
        &mut via_leader,
        vec![event("Written", r#"{"i":120}"#)],
        vec![],
    )
    .await
    .expect("write");
    let events = all_events(&mut client(&cluster, behind).await)
        .await
        .expect("read");
    assert_eq!(events.len(), 121);
}

/// Makes `target` the leader with `cairn cluster transfer-leader`. Another caught-up voter
/// may win the election a transfer starts (it is reported); the transfer is asked again
/// then, of whichever node leads.
async fn hand_leadership_to(cluster: &Cluster, target: u64) {
    let ids = cluster.ids();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current = cluster.leader_among(&ids).await;
        if current == target {
            return;
        }
        // The leader transfers only to a voter it knows has replicated its whole log.
        wait_for("the leader to see the target caught up", || async move {
            let s = cluster.status(current).await.ok()?;
            s.followers
                .iter()
                .any(|f| f.node_id == target && f.matched_index >= s.committed_index)
                .then_some(())
        })
        .await;
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args([
                "cluster",
                "transfer-leader",
                &target.to_string(),
                "--endpoint",
            ])
            .arg(cluster.member(current).peer_addr().to_string())
            .args(["--cluster-secret", SECRET])
            .output()
            .expect("cairn cluster");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            assert!(stdout.contains(&format!("node {target} leads")), "{stdout}");
        } else {
            assert!(stderr.contains("won the election instead"), "{stderr}");
            assert!(attempts < 3, "the transfer kept losing: {stderr}");
        }
    }
}

/// X1 in a cluster: the event-id index is state-machine state, so a node that caught up by
/// snapshot install (the log it missed purged) has it, and answers retries as the node
/// that took the writes did once it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retries_hold_on_a_node_that_caught_up_from_a_snapshot() {
    const PAY: &str = "pay";
    let mut cluster = Cluster::start(
        3,
        &[
            "--snapshot-every-entries",
            "20",
            "--raft-log-kept",
            "5",
            "--idempotent-boundaries",
            PAY,
        ],
    )
    .await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let behind = others(&cluster.ids(), leader)[0];
    cluster.kill(behind);
    let write = |i: usize| {
        vec![pb::EventToSave {
            event_id: format!("w-{i}"),
            event_type: "Paid".into(),
            data: format!(r#"{{"i":{i}}}"#),
            metadata: String::new(),
        }]
    };
    let save_to = |es: &mut EventStoreClient<Channel>, events| {
        let mut es = es.clone();
        async move {
            es.save_events_v2(admin(pb::SaveEventsV2Request {
                boundary: PAY.into(),
                events,
                consistency: vec![],
            }))
            .await
            .map(|r| r.into_inner())
        }
    };
    let mut via_leader = client(&cluster, leader).await;
    let mut results = Vec::new();
    for i in 0..60 {
        results.push(save_to(&mut via_leader, write(i)).await.expect("write"));
    }
    cluster.restart(behind).await;
    let http = cluster.node(behind).http_addr;
    let metrics = wait_for("the node to install a snapshot", move || async move {
        let metrics = http_get(http, "/metrics").await;
        (metric(&metrics, "cairn_raft_snapshot_installs_total") >= 1.0).then_some(metrics)
    })
    .await;
    assert!(metrics.contains("cairn_raft_snapshot_installs_total"));
    hand_leadership_to(&cluster, behind).await;

    let mut via_new_leader = client(&cluster, behind).await;
    for (i, original) in results.iter().enumerate() {
        let retry = save_to(&mut via_new_leader, write(i))
            .await
            .expect("an identical retry");
        assert_eq!(&retry, original, "write {i}");
    }
    let mut altered = write(7);
    altered[0].data = r#"{"i":"seven"}"#.into();
    let status = save_to(&mut via_new_leader, altered)
        .await
        .expect_err("an altered retry");
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(
        status.message().contains("event_id \"w-7\"") && status.message().contains("(8, 7)"),
        "{}",
        status.message()
    );
    let count = |es: &mut EventStoreClient<Channel>| {
        let mut es = es.clone();
        async move {
            es.get_events(admin(pb::GetEventsRequest {
                boundary: PAY.into(),
                count: 1000,
                direction: pb::Direction::Asc as i32,
                ..Default::default()
            }))
            .await
            .expect("read")
            .into_inner()
            .events
            .len()
        }
    };
    for id in cluster.ids() {
        assert_eq!(
            count(&mut client(&cluster, id).await).await,
            60,
            "node {id}: no retry wrote"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restarts_with_its_data_and_hands_leadership_over() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let target = others(&cluster.ids(), leader)[0];
    hand_leadership_to(&cluster, target).await;
    assert_eq!(cluster.leader_among(&[1, 2, 3]).await, target);

    let mut via = client(&cluster, leader).await;
    let mut written = Vec::new();
    for i in 0..10 {
        let e = event("Kept", &format!(r#"{{"i":{i}}}"#));
        written.push(e.event_id.clone());
        save(&mut via, vec![e], vec![]).await.expect("write");
    }
    for id in cluster.ids() {
        let node = cluster
            .members
            .get_mut(&id)
            .and_then(|m| m.node.take())
            .expect("runs");
        assert!(node.terminate().await.success(), "node {id} stops cleanly");
    }
    // All three come back together (none can serve before a quorum is up).
    let launching: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.relaunch(id)))
        .collect();
    for (id, launching) in launching {
        let node = launching.serving_async().await;
        cluster.adopt(id, node);
    }
    cluster.leader_among(&[1, 2, 3]).await;
    for id in cluster.ids() {
        let events = all_events(&mut client(&cluster, id).await)
            .await
            .expect("read");
        let ids: Vec<String> = events.into_iter().map(|e| e.event_id).collect();
        assert_eq!(ids, written, "node {id} kept every write");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Prometheus (../shared/tools/prometheus); run by .ci/run with --ignored"]
async fn the_cluster_alerts_fire_on_a_real_prometheus() {
    use support::prometheus::{Prometheus, alert_rules_without_delays};
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let targets: Vec<_> = cluster
        .ids()
        .iter()
        .map(|&id| cluster.node(id).http_addr)
        .collect();
    let prometheus = Prometheus::start(&targets, &alert_rules_without_delays());
    // An evaluation between the first scrapes of the followers and of the leader sees no
    // leader; the healthy cluster must settle with neither alert firing.
    wait_for("the healthy cluster to raise no alert", || {
        let settled = prometheus.value("count(up == 1)") == Some(3.0)
            && prometheus.value("max(cairn_raft_is_leader)") == Some(1.0)
            && !prometheus.fires("CairnNoLeader")
            && !prometheus.fires("CairnReplicationLag");
        async move { settled.then_some(()) }
    })
    .await;

    // A frozen follower falls more than 10,000 entries behind while the others commit.
    let lagging = others(&[1, 2, 3], leader)[0];
    cluster.pause(lagging);
    // One write at a time: each entry carries one command (concurrent writes would share).
    let mut es = client(&cluster, leader).await;
    for _ in 0..10_050 {
        save(&mut es, vec![event("Lagging", "{}")], vec![])
            .await
            .expect("two of three commit");
    }
    let labels = prometheus
        .await_firing("CairnReplicationLag", |labels| {
            labels["peer"].as_str() == Some(lagging.to_string().as_str())
        })
        .await;
    assert_eq!(
        labels["instance"],
        cluster.node(leader).http_addr.to_string(),
        "the leader reports the lag"
    );
    cluster.resume(lagging);

    // Leadership moving again and again: the leader freezes, the others elect another.
    let mut current = leader;
    for _ in 0..2 {
        cluster.pause(current);
        let rest = others(&[1, 2, 3], current);
        let next = cluster.leader_among(&rest).await;
        cluster.resume(current);
        current = next;
    }
    prometheus
        .await_firing("CairnFrequentLeaderChanges", |_| true)
        .await;

    // Two of three frozen: the one left cannot elect a leader.
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let left = others(&[1, 2, 3], leader)[0];
    let frozen = others(&others(&[1, 2, 3], leader), left)[0];
    cluster.pause(leader);
    cluster.pause(frozen);
    prometheus.await_firing("CairnNoLeader", |_| true).await;
    prometheus
        .await_firing("CairnNodeDown", |labels| {
            labels["instance"].as_str() == Some(cluster.node(leader).http_addr.to_string().as_str())
        })
        .await;
    cluster.resume(leader);
    cluster.resume(frozen);
}
