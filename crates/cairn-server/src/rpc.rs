//! What every gRPC handler shares: reaching the node while it starts, and turning domain
//! results into responses through the one error → status mapping (`cairn_proto::to_status`).

use std::sync::{Arc, OnceLock};

use cairn_core::Error;
use tonic::{Response, Status};

/// What a call gets before storage and Raft are up (retryable).
pub const NODE_STARTING: &str = "node is starting: storage or raft not ready yet";

/// The node (whatever a port's services work on), or UNAVAILABLE while it starts.
pub fn node_of<T>(ready: &OnceLock<Arc<T>>) -> Result<Arc<T>, Status> {
    ready.get().cloned().ok_or_else(starting)
}

/// UNAVAILABLE: the node is starting.
pub fn starting() -> Status {
    cairn_proto::to_status(Error::Unavailable(NODE_STARTING.to_string()))
}

/// A handler's result as a gRPC response.
pub fn reply<T>(result: Result<T, Error>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(cairn_proto::to_status)
}
