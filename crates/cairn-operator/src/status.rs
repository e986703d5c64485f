//! The last step of a reconcile: what the resource's status says. Pure: it is computed from
//! what the reconcile observed and the time it is given, so every phase is testable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::build::{CLIENT_PORT, quorum};
use crate::crd::{BoundaryStatus, Member, Phase};
use crate::validate::Invalid;

/// What the reconcile saw of the running cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Nodes the spec wants.
    pub replicas: i32,
    /// Pods passing their readiness probe.
    pub ready_replicas: i32,
    /// True when the StatefulSet controller has seen the latest pod template.
    pub rolled_out: bool,
    /// What the pods said of the Raft group.
    pub cluster: ClusterSummary,
    /// The volumes' growth, when `storage.size` grew.
    pub volumes: Volumes,
    /// What the pods' certificates still wait for (cert-manager mode), when they do.
    pub awaiting_certificates: Option<String>,
}

/// The claims of a Boundary against the size `storage.size` asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Volumes {
    /// The size asked for.
    pub wanted: String,
    /// Claims asked to grow whose capacity has not reached it yet (the storage driver and
    /// the kubelet resize them).
    pub growing: usize,
    /// Why the API server refused to grow a claim (typically: its storage class does not
    /// allow expansion).
    pub refused: Option<String>,
}

/// The Raft group as the operator saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSummary {
    /// The leading pod, when one answered.
    pub leader: Option<String>,
    /// The leader's membership.
    pub members: Vec<Member>,
    /// True when the voters are exactly the wanted nodes (no change under way).
    pub settled: bool,
    /// How many pods answered the operator.
    pub answered: usize,
}

/// The status of a Boundary named `name` in `namespace` whose spec is `generation`: either
/// applied (`Ok`, with what runs) or refused (`Err`, with what ran before, if anything).
pub fn compute(
    name: &str,
    namespace: &str,
    generation: Option<i64>,
    outcome: Result<&Observation, (&Invalid, Option<&Observation>)>,
    previous: Option<&BoundaryStatus>,
    now: Timestamp,
) -> BoundaryStatus {
    let (observation, invalid) = match outcome {
        Ok(observation) => (Some(observation), None),
        Err((invalid, observation)) => (observation, Some(invalid)),
    };
    let phase = match observation {
        None => Phase::Pending,
        Some(o) if o.cluster.leader.is_some() && o.ready_replicas >= quorum(o.replicas) => {
            if o.ready_replicas < o.replicas {
                Phase::Degraded
            } else if o.rolled_out && o.cluster.settled {
                Phase::Active
            } else {
                // Everything answers; pods are being replaced or the membership changes.
                Phase::Provisioning
            }
        }
        // No leader or below quorum: failed if it has served before, else still coming up.
        Some(_) => match previous.and_then(|p| p.phase) {
            Some(Phase::Active | Phase::Degraded | Phase::Failed) => Phase::Failed,
            _ => Phase::Provisioning,
        },
    };
    let ready = observation.map_or(0, |o| o.ready_replicas);
    let wanted = observation.map_or(0, |o| o.replicas);

    // Each condition as (status, reason, message).
    let leader = observation.and_then(|o| o.cluster.leader.as_deref());
    let available: (&str, String, String) = match (phase, leader) {
        (Phase::Pending, _) => ("False", "NotApplied".into(), "nothing runs yet".to_string()),
        (_, Some(leader)) if ready >= quorum(wanted) => (
            "True",
            "Quorum".into(),
            format!("{ready} of {wanted} nodes ready, {leader} leads"),
        ),
        (Phase::Failed, _) => (
            "False",
            "NoQuorum".into(),
            match leader {
                Some(_) => format!(
                    "{ready} of {wanted} nodes ready, fewer than the {} a quorum needs",
                    quorum(wanted)
                ),
                None => no_leader(observation),
            },
        ),
        _ => (
            "False",
            "Starting".into(),
            format!(
                "{ready} of {wanted} nodes ready; {}",
                no_leader(observation)
            ),
        ),
    };
    let growing = observation.map_or(0, |o| o.volumes.growing);
    let awaiting = observation.and_then(|o| o.awaiting_certificates.as_deref());
    let progressing: (&str, String, String) = match (invalid, phase) {
        (Some(_), _) => (
            "False",
            "SpecInvalid".into(),
            "the spec was refused; fix it to continue".to_string(),
        ),
        (None, _) if awaiting.is_some() => (
            "True",
            "WaitingForCertificates".into(),
            awaiting.unwrap_or_default().to_string(),
        ),
        (None, _) if growing > 0 => (
            "True",
            "VolumesGrowing".into(),
            format!(
                "{growing} volume(s) growing to {}",
                observation.map_or("", |o| o.volumes.wanted.as_str())
            ),
        ),
        (None, Phase::Active) => (
            "False",
            "Stable".into(),
            "every node runs the spec".to_string(),
        ),
        (None, _)
            if observation.is_some_and(|o| o.cluster.leader.is_some() && !o.cluster.settled) =>
        {
            (
                "True",
                "MembershipChanging".into(),
                format!(
                    "{ready} of {wanted} nodes ready; the Raft membership moves to {wanted} voters"
                ),
            )
        }
        (None, _) => (
            "True",
            "Reconciling".into(),
            format!("{ready} of {wanted} nodes ready"),
        ),
    };
    let degraded = match (invalid, phase) {
        (Some(invalid), _) => ("True", invalid.reason.to_string(), invalid.message.clone()),
        (None, Phase::Degraded | Phase::Failed) if ready < wanted => (
            "True",
            "NodesNotReady".to_string(),
            format!("{} of {wanted} nodes are not ready", wanted - ready),
        ),
        (None, Phase::Failed) => ("True", "NoLeader".to_string(), no_leader(observation)),
        (None, _) => match observation.and_then(|o| o.volumes.refused.as_ref()) {
            Some(refused) => (
                "True",
                "VolumeResizeRefused".to_string(),
                format!(
                    "the volumes cannot grow to {}: {refused}",
                    observation.map_or("", |o| o.volumes.wanted.as_str())
                ),
            ),
            None => ("False", "AsExpected".to_string(), String::new()),
        },
    };

    let previous_conditions = previous.map(|p| p.conditions.as_slice()).unwrap_or(&[]);
    let condition = |type_: &str, (status, reason, message): (&str, String, String)| {
        // The transition time moves only when the status does, as Kubernetes expects.
        let last_transition_time = previous_conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time,
        }
    };
    BoundaryStatus {
        phase: Some(phase),
        ready_replicas: ready,
        leader: leader.map(str::to_string),
        members: observation
            .map(|o| o.cluster.members.clone())
            .unwrap_or_default(),
        endpoint: observation.map(|_| format!("{name}.{namespace}.svc:{CLIENT_PORT}")),
        observed_generation: generation,
        conditions: vec![
            condition("Available", available),
            condition("Progressing", progressing),
            condition("Degraded", degraded),
        ],
    }
}

fn no_leader(observation: Option<&Observation>) -> String {
    match observation.map_or(0, |o| o.cluster.answered) {
        0 => "no node answered the operator's cluster status call".to_string(),
        n => format!("{n} nodes answered, none leads"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::InvalidReason;

    #[test]
    fn growing_volumes_show_as_progress_and_a_refusal_as_degraded() {
        let mut growing = running(3, 3);
        growing.volumes = Volumes {
            wanted: "20Gi".into(),
            growing: 2,
            refused: None,
        };
        let status = compute("orders", "shop", Some(2), Ok(&growing), None, at(10));
        assert_eq!(
            status.phase,
            Some(Phase::Active),
            "the nodes serve meanwhile"
        );
        let progressing = &status.conditions[1];
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "VolumesGrowing")
        );
        assert_eq!(progressing.message, "2 volume(s) growing to 20Gi");

        let mut refused = running(3, 3);
        refused.volumes = Volumes {
            wanted: "20Gi".into(),
            growing: 0,
            refused: Some("storage class standard does not allow expansion".into()),
        };
        let status = compute("orders", "shop", Some(2), Ok(&refused), None, at(10));
        let degraded = &status.conditions[2];
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "VolumeResizeRefused")
        );
        assert!(
            degraded.message.contains("cannot grow to 20Gi"),
            "{}",
            degraded.message
        );
    }

    #[test]
    fn waiting_for_certificates_is_what_progressing_says() {
        let waiting = Observation {
            replicas: 3,
            awaiting_certificates: Some(
                "waiting for cert-manager to issue Secret orders-0-cert".into(),
            ),
            ..Observation::default()
        };
        let status = compute("orders", "shop", Some(1), Ok(&waiting), None, at(10));
        assert_eq!(status.phase, Some(Phase::Provisioning));
        let progressing = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .expect("Progressing");
        assert_eq!(progressing.status, "True");
        assert_eq!(progressing.reason, "WaitingForCertificates");
        assert!(progressing.message.contains("orders-0-cert"));
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("timestamp")
    }

    fn running(replicas: i32, ready: i32) -> Observation {
        Observation {
            replicas,
            ready_replicas: ready,
            rolled_out: true,
            cluster: ClusterSummary {
                leader: Some("orders-1".into()),
                members: (1..=replicas as u64)
                    .map(|id| Member {
                        id,
                        pod: format!("orders-{}", id - 1),
                        role: "voter".into(),
                    })
                    .collect(),
                settled: true,
                answered: ready as usize,
            },
            volumes: Volumes::default(),
            awaiting_certificates: None,
        }
    }

    fn status(
        outcome: Result<&Observation, (&Invalid, Option<&Observation>)>,
        previous: Option<&BoundaryStatus>,
    ) -> BoundaryStatus {
        compute("orders", "shop", Some(2), outcome, previous, at(1000))
    }

    fn condition<'a>(status: &'a BoundaryStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    #[test]
    fn phases_follow_readiness_and_quorum() {
        assert_eq!(
            status(Ok(&running(3, 0)), None).phase,
            Some(Phase::Provisioning)
        );
        assert_eq!(
            status(Ok(&running(3, 1)), None).phase,
            Some(Phase::Provisioning)
        );
        let active = status(Ok(&running(3, 3)), None);
        assert_eq!(active.phase, Some(Phase::Active));
        assert_eq!(active.endpoint.as_deref(), Some("orders.shop.svc:5005"));
        assert_eq!(active.observed_generation, Some(2));
        assert_eq!(condition(&active, "Available").status, "True");
        assert_eq!(condition(&active, "Progressing").reason, "Stable");
        assert_eq!(condition(&active, "Degraded").status, "False");

        let degraded = status(Ok(&running(3, 2)), Some(&active));
        assert_eq!(degraded.phase, Some(Phase::Degraded));
        assert_eq!(condition(&degraded, "Available").status, "True");
        assert_eq!(condition(&degraded, "Degraded").reason, "NodesNotReady");

        let failed = status(Ok(&running(3, 1)), Some(&degraded));
        assert_eq!(failed.phase, Some(Phase::Failed));
        assert_eq!(condition(&failed, "Available").reason, "NoQuorum");

        let rolling = Observation {
            rolled_out: false,
            ..running(3, 3)
        };
        assert_eq!(status(Ok(&rolling), None).phase, Some(Phase::Provisioning));
    }

    #[test]
    fn the_leader_and_members_are_what_the_pods_said() {
        let active = status(Ok(&running(3, 3)), None);
        assert_eq!(active.leader.as_deref(), Some("orders-1"));
        assert_eq!(
            active
                .members
                .iter()
                .map(|m| m.pod.as_str())
                .collect::<Vec<_>>(),
            ["orders-0", "orders-1", "orders-2"]
        );
        assert!(
            condition(&active, "Available")
                .message
                .contains("orders-1 leads")
        );

        let mut leaderless = running(3, 3);
        leaderless.cluster = ClusterSummary {
            answered: 3,
            ..ClusterSummary::default()
        };
        let starting = status(Ok(&leaderless), None);
        assert_eq!(starting.phase, Some(Phase::Provisioning));
        assert_eq!(starting.leader, None);
        assert!(starting.members.is_empty());
        assert_eq!(condition(&starting, "Available").reason, "Starting");
        let lost = status(Ok(&leaderless), Some(&active));
        assert_eq!(lost.phase, Some(Phase::Failed));
        let degraded = condition(&lost, "Degraded");
        assert_eq!(degraded.reason, "NoLeader");
        assert!(degraded.message.contains("3 nodes answered, none leads"));
    }

    #[test]
    fn a_membership_change_is_progress_not_trouble() {
        let mut growing = running(5, 5);
        growing.cluster.settled = false;
        let status = status(Ok(&growing), None);
        assert_eq!(status.phase, Some(Phase::Provisioning));
        assert_eq!(condition(&status, "Available").status, "True");
        assert_eq!(
            condition(&status, "Progressing").reason,
            "MembershipChanging"
        );
        assert_eq!(condition(&status, "Degraded").status, "False");
    }

    #[test]
    fn a_refused_spec_is_reported_and_keeps_what_runs() {
        let invalid = Invalid {
            reason: InvalidReason::UnsupportedReplicas,
            message: "replicas must be 1, 3 or 5, not 4".into(),
        };
        let never_ran = status(Err((&invalid, None)), None);
        assert_eq!(never_ran.phase, Some(Phase::Pending));
        assert_eq!(never_ran.endpoint, None);
        let degraded = condition(&never_ran, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "UnsupportedReplicas")
        );
        assert!(degraded.message.contains("not 4"));
        assert_eq!(condition(&never_ran, "Progressing").reason, "SpecInvalid");

        let running_before = status(Err((&invalid, Some(&running(3, 3)))), None);
        assert_eq!(running_before.phase, Some(Phase::Active));
        assert_eq!(condition(&running_before, "Degraded").status, "True");
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let first = compute("orders", "shop", Some(1), Ok(&running(3, 3)), None, at(10));
        let again = compute(
            "orders",
            "shop",
            Some(1),
            Ok(&running(3, 3)),
            Some(&first),
            at(20),
        );
        assert_eq!(
            condition(&again, "Available").last_transition_time,
            Time(at(10))
        );
        let lost = compute(
            "orders",
            "shop",
            Some(1),
            Ok(&running(3, 1)),
            Some(&again),
            at(30),
        );
        assert_eq!(
            condition(&lost, "Available").last_transition_time,
            Time(at(30))
        );
    }
}
