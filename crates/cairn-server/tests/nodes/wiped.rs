//! A member whose disk was wiped comes back with its original flags (as a StatefulSet pod
//! whose volume was lost does): it must not vote on the log it lost, and it must rejoin
//! and catch up without losing or repeating an acknowledged write.

use crate::support;

use std::time::Duration;

use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use support::admin;
use support::cluster::{Cluster, wait_for};
use tonic::transport::Channel;

const BOUNDARY: &str = "default";
/// How long the survivors are watched for a leader they must not elect (several election
/// timeouts of the harness's timing).
const NO_LEADER_WINDOW: Duration = Duration::from_secs(4);

async fn client(cluster: &Cluster, id: u64) -> EventStoreClient<Channel> {
    EventStoreClient::new(cluster.node(id).channel().await)
}

/// Writes `n` events one by one, each acknowledged; returns their ids in order.
async fn write_acknowledged(es: &mut EventStoreClient<Channel>, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = uuid::Uuid::now_v7().to_string();
        es.save_events_v2(admin(pb::SaveEventsV2Request {
            boundary: BOUNDARY.into(),
            events: vec![pb::EventToSave {
                event_id: id.clone(),
                event_type: "Deposited".into(),
                data: format!(r#"{{"account":"a","n":{i}}}"#),
                metadata: String::new(),
            }],
            consistency: vec![],
        }))
        .await
        .expect("an acknowledged write");
        ids.push(id);
    }
    ids
}

/// The ids of every event of the boundary on node `id`, oldest first.
async fn event_ids(cluster: &Cluster, id: u64) -> Vec<String> {
    let mut es = client(cluster, id).await;
    es.get_events(admin(pb::GetEventsRequest {
        boundary: BOUNDARY.into(),
        count: 10_000,
        direction: pb::Direction::Asc as i32,
        ..Default::default()
    }))
    .await
    .expect("read the events")
    .into_inner()
    .events
    .into_iter()
    .map(|e| e.event_id)
    .collect()
}

/// Watches `ids` for [`NO_LEADER_WINDOW`] and fails if any of them leads: these nodes
/// cannot elect a leader without a vote from a wiped node. (A follower may still name the
/// dead leader until its election timeout.)
async fn no_leader_among(cluster: &Cluster, ids: &[u64]) {
    let until = tokio::time::Instant::now() + NO_LEADER_WINDOW;
    while tokio::time::Instant::now() < until {
        for &id in ids {
            if let Ok(status) = cluster.status(id).await {
                assert_ne!(
                    status.role, "leader",
                    "node {id} was elected with a wiped node's vote: {status:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn standing_is(cluster: &Cluster, id: u64, standing: &str) {
    wait_for("a node to report its standing", || async {
        let status = cluster.status(id).await.ok()?;
        (status.standing == standing).then_some(())
    })
    .await;
}

/// The reproduction of the review's finding: a lagging follower S, a leader L and a
/// follower O that both acknowledged 20 writes; L and O crash and O's disk is wiped; O
/// comes back with its original flags while L is still down. Before the fix O voted for S
/// (or, as the lowest member, formed a new group) and S, which never had the writes, led:
/// when L came back its log was cut to S's, and all 20 acknowledged events were gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_and_a_crash_lose_no_acknowledged_write() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
    // The lowest id is the wiped one when it can be: it is the one that used to form a new
    // group on an empty directory.
    let (wiped, lagging) = (followers[0], followers[1]);

    cluster.isolate(lagging);
    let written = write_acknowledged(&mut client(&cluster, leader).await, 20).await;

    cluster.kill(leader);
    cluster.kill(wiped);
    cluster.wipe(wiped);
    let coming_back = cluster.relaunch(wiped);
    cluster.heal();

    standing_is(&cluster, wiped, "rejoining").await;
    no_leader_among(&cluster, &[wiped, lagging]).await;

    // The old leader comes back with the writes: it leads, re-admits the wiped node, and
    // every node ends with exactly the 20 events.
    cluster.restart(leader).await;
    let node = coming_back.serving_async().await;
    cluster.adopt(wiped, node);
    cluster.voting_everywhere(wiped).await;
    for id in [1, 2, 3] {
        assert_eq!(
            event_ids(&cluster, id).await,
            written,
            "node {id} does not hold exactly the acknowledged events"
        );
    }
}

/// Every node restarts with its data after the wiped one rejoined: the rejoin is over for
/// good (the node votes after a restart), and the group still has one leader and the
/// events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoined_node_votes_after_a_restart_and_a_leader_change() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let written = write_acknowledged(&mut client(&cluster, leader).await, 10).await;
    let wiped = cluster
        .ids()
        .into_iter()
        .find(|&i| i != leader)
        .expect("a follower");
    cluster.kill(wiped);
    cluster.wipe(wiped);
    cluster.restart(wiped).await;
    cluster.voting_everywhere(wiped).await;

    // Now it must vote: with the old leader down, the other two elect one.
    cluster.kill(wiped);
    cluster.restart(wiped).await;
    cluster.kill(leader);
    let survivors: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
    let new_leader = cluster.leader_among(&survivors).await;
    let more = write_acknowledged(&mut client(&cluster, new_leader).await, 5).await;
    let expected: Vec<String> = written.into_iter().chain(more).collect();
    for id in survivors {
        assert_eq!(event_ids(&cluster, id).await, expected, "node {id}");
    }
}

/// Two of three voters lose their disks while the third holds every write. Before the fix
/// the two formed a majority over empty logs and the third's log was cut to theirs. Now
/// they refuse to vote and the group waits, because nothing tells the survivor has every
/// acknowledged write; told by an operator to accept its log (`cairn cluster allow-vote`),
/// they elect it, rejoin and catch up, and every node holds exactly the 20 events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_wiped_voters_of_three_wait_for_an_operator_and_lose_nothing() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let written = write_acknowledged(&mut client(&cluster, leader).await, 20).await;
    let last = cluster.status(leader).await.expect("status").last_log_index;
    cluster.applied_everywhere(&[1, 2, 3], last).await;

    let (survivor, wiped) = (3, [1, 2]);
    let mut coming_back = Vec::new();
    for id in wiped {
        cluster.kill(id);
        cluster.wipe(id);
        coming_back.push((id, cluster.relaunch(id)));
    }
    for id in wiped {
        standing_is(&cluster, id, "rejoining").await;
    }
    no_leader_among(&cluster, &[1, 2, 3]).await;
    let kept = cluster
        .status(survivor)
        .await
        .expect("status")
        .last_log_index;
    assert!(
        kept >= last,
        "the survivor's log shrank to {kept} from {last}"
    );

    for (i, id) in wiped.into_iter().enumerate() {
        match cluster.try_cli(id, &["allow-vote", &survivor.to_string()]) {
            Ok(said) => assert!(said.contains("may now vote for node 3"), "{said}"),
            // The first vote already elected the survivor, which made this node a learner
            // and a voter again before it was asked: nothing was left to allow.
            Err(said) if i > 0 && said.contains("votes as usual: nothing to allow") => {}
            Err(said) => panic!("allow-vote on node {id}: {said}"),
        }
    }
    for (id, launching) in coming_back {
        let node = launching.serving_async().await;
        cluster.adopt(id, node);
    }
    for id in wiped {
        cluster.voting_everywhere(id).await;
    }
    for id in [1, 2, 3] {
        assert_eq!(event_ids(&cluster, id).await, written, "node {id}");
    }
}

/// The leader remembers how far a follower's log matched; a wiped follower has lost that.
/// Found by the bank test's wipe nemesis: with the log purged past what the follower had,
/// openraft's search for the matching entry ran below its remembered match and wrapped
/// around, the leader sent the entries after its purge point as if they began the log, and
/// the wiped node's Raft stopped ("try to get log at index 0 but got 602"). The leader must
/// start over (the `loosen-follower-log-revert` feature) and send a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_follower_rejoins_from_a_snapshot_when_the_leader_purged_its_log() {
    let mut cluster = Cluster::start(
        3,
        &["--snapshot-every-entries", "20", "--raft-log-kept", "5"],
    )
    .await;
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let wiped = cluster
        .ids()
        .into_iter()
        .find(|&i| i != leader)
        .expect("a follower");
    // Purged up to a point below what the follower had, which it loses straight away.
    let mut written = write_acknowledged(&mut client(&cluster, leader).await, 60).await;
    cluster.kill(wiped);
    cluster.wipe(wiped);
    cluster.restart(wiped).await;
    cluster.voting_everywhere(wiped).await;
    written.extend(write_acknowledged(&mut client(&cluster, leader).await, 5).await);
    let last = cluster.status(leader).await.expect("status").last_log_index;
    cluster.applied_everywhere(&cluster.ids(), last).await;
    for id in cluster.ids() {
        assert_eq!(event_ids(&cluster, id).await, written, "node {id}");
    }
}
