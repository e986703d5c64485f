//! The peer port: Raft traffic (`cairn.v1.Raft`) and the cluster API (`cairn.v1.Cluster`)
//! between nodes, every call authenticated by the cluster secret (and, with peer TLS, by
//! the caller's certificate).
//!
//! - [`client`]: [`PeerClient`] dials other nodes. It is openraft's transport (it
//!   implements `cairn_raft::PeerTransport`) and the client of the cluster API.
//! - [`forward_client`]: a follower's writes and read-index requests travel to the leader
//!   on one long-lived stream per leader.
//! - [`forward_server`]: the leader's end of those streams.
//! - [`service`]: the two gRPC services, on a [`PeerNode`].
//! - [`identity`]: the cluster id every Raft message carries, so two groups never mix.
//!
//! openraft's messages and Cairn's commands travel as bytes encoded by `cairn_raft::codec`,
//! the same encoding as the Raft log.
//!
//! This module knows Raft and nothing above it: what a leader does with a forwarded write
//! ([`Leader`]) and how the group's membership changes ([`ClusterCalls`]) are handed in by
//! the node when it starts, so the layers point one way: services → router → peer → raft.

use std::time::Duration;

use cairn_core::command::Outcome;
use serde::{Deserialize, Serialize};

pub mod client;
pub mod forward_client;
pub mod forward_server;
pub mod identity;
pub mod service;

#[cfg(test)]
mod forward_tests;

pub use client::PeerClient;
pub use forward_server::{ForwardedReplies, Leader};
pub use identity::ClusterIdentity;
pub use service::{
    Claims, ClusterCalls, ClusterService, PeerNode, PeerReady, RaftService, SecretCheck,
};

/// Largest peer message, either way. A Raft entry holds at most 8 MiB of commands; an
/// AppendEntries over this size is split by openraft (we answer `PayloadTooLarge`).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Deadline of cluster-API calls between nodes (a forwarded write's is set by the server
/// from its leader wait, see `ServeConfig::forward_timeout`).
pub const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the leader answers a forwarded command.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    /// The command was applied (or rejected by the state machine: a conflict is an outcome).
    Outcome(Outcome),
    /// The receiver does not lead; nothing was proposed.
    NotLeader {
        /// The leader it knows of.
        leader_id: Option<u64>,
        /// Its address.
        leader_addr: Option<String>,
    },
    /// The receiver leads but could not replicate; the command may or may not be applied.
    Unavailable(String),
}
