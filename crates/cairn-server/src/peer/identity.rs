//! The cluster id: which group a node belongs to, so that two groups never mix.
//!
//! A restore turns an old cluster's data into a new cluster (docs/backup.md). Members of
//! the old one may still run, at the same addresses even, and share its secret and CA: if
//! its leader's appends reached the new cluster, they would overwrite it; if a candidate of
//! one won votes in the other, it could lead both. So every group formed by this version
//! has a random id, kept in each member's data directory ([`CLUSTER_ID_FILE`]) and sent
//! with every Raft message ([`CLUSTER_ID_HEADER`]):
//! - a node with an id takes Raft messages only with the same id;
//! - a node without one (joining with an empty data directory, or rejoining after losing
//!   it) takes the first id a group's messages carry, durably, and from then on only it;
//! - the node that forms a group (alone, or the lowest of its initial members) and
//!   `cairn restore` make a new id.
//!
//! A group formed by an older version has no id and sends none; its members accept each
//! other as before.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use cairn_core::Error;
use tonic::Status;

/// Metadata key of the cluster id on Raft messages between nodes.
pub const CLUSTER_ID_HEADER: &str = "x-cairn-cluster-id";
/// File (in the data directory) holding the node's cluster id.
pub const CLUSTER_ID_FILE: &str = "cluster-id";

/// Why the cluster id cannot be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written.
    #[error("failed to {what} {path}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The file.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The file holds something else than an id.
    #[error("{path} does not hold a cluster id (32 hex digits): {found:?}")]
    Malformed {
        /// The file.
        path: String,
        /// What it holds.
        found: String,
    },
    /// The id could not be written durably.
    #[error("failed to keep the cluster id: {0}")]
    Keep(cairn_store::StoreError),
    /// A restore target already belongs to a cluster.
    #[error("{0} already holds a cluster id")]
    Exists(String),
}

/// Whether `id` is a cluster id as this version makes them (a v4 UUID's 32 hex digits).
pub fn valid_cluster_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The node's cluster id, shared by the peer client (which sends it) and the peer service
/// (which checks and adopts it). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ClusterIdentity {
    path: PathBuf,
    id: Arc<RwLock<Option<String>>>,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> IdentityError + 'a {
    move |source| IdentityError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Writes `id` as `path`, durably (a temporary file renamed, the directory synced).
fn write_id(path: &Path, id: &str) -> Result<(), IdentityError> {
    cairn_store::write_file_durably(path, format!("{id}\n").as_bytes()).map_err(IdentityError::Keep)
}

fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl ClusterIdentity {
    /// The identity kept in `data_dir` (none yet if the file is missing).
    pub fn load(data_dir: &Path) -> Result<Self, IdentityError> {
        let path = data_dir.join(CLUSTER_ID_FILE);
        let id = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let id = text.trim().to_string();
                if !valid_cluster_id(&id) {
                    return Err(IdentityError::Malformed {
                        path: path.display().to_string(),
                        found: text,
                    });
                }
                Some(id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("read", &path)(e)),
        };
        Ok(ClusterIdentity {
            path,
            id: Arc::new(RwLock::new(id)),
        })
    }

    /// Gives the data directory of a restore a new id of its own.
    pub fn create_new(data_dir: &Path) -> Result<String, IdentityError> {
        let path = data_dir.join(CLUSTER_ID_FILE);
        if path.exists() {
            return Err(IdentityError::Exists(path.display().to_string()));
        }
        let id = new_id();
        write_id(&path, &id)?;
        Ok(id)
    }

    /// The id, if this node has one.
    pub fn id(&self) -> Option<String> {
        self.id.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes an id for a group this node forms, unless it has one (a restored directory).
    pub fn form(&self) -> Result<String, IdentityError> {
        let mut id = self.id.write().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = id.as_ref() {
            return Ok(id.clone());
        }
        let made = new_id();
        write_id(&self.path, &made)?;
        tracing::info!(cluster_id = %made, "formed a new cluster");
        *id = Some(made.clone());
        Ok(made)
    }

    /// Refuses a message of another cluster than this node's (`presented`; none: from a
    /// group without an id). A node without an id yet refuses nothing and adopts nothing.
    fn refuse_foreign(&self, presented: Option<&str>) -> Result<(), Status> {
        let denied = |why: String| Err(cairn_proto::to_status(Error::PermissionDenied(why)));
        let Some(mine) = self.id() else {
            return Ok(());
        };
        match presented {
            Some(theirs) if theirs == mine => Ok(()),
            Some(theirs) => denied(format!(
                "this node belongs to cluster {mine}, the message to cluster {theirs}: the two are different groups (one restored from the other's backup, or two groups sharing a secret), and never exchange Raft messages or forwarded writes"
            )),
            None => denied(format!(
                "this node belongs to cluster {mine}, the message names no cluster: it comes from a group formed by an older version, which this one never joins"
            )),
        }
    }

    /// Takes a write or read forwarded by a member of `presented`, or says why not. Unlike
    /// [`Self::admit`] it never adopts an id: only Raft's own messages make a node a member.
    pub fn admit_forwarded(&self, presented: Option<&str>) -> Result<(), Status> {
        self.refuse_foreign(presented)
    }

    /// Takes a Raft message carrying `presented` (none: from a group without an id), or
    /// says why not. A node without an id adopts the one presented.
    pub fn admit(&self, presented: Option<&str>) -> Result<(), Status> {
        let denied = |why: String| Err(cairn_proto::to_status(Error::PermissionDenied(why)));
        if self.id().is_some() {
            return self.refuse_foreign(presented);
        }
        let Some(theirs) = presented else {
            return Ok(());
        };
        if !valid_cluster_id(theirs) {
            return Err(Status::invalid_argument(format!(
                "{CLUSTER_ID_HEADER} {theirs:?} is not a cluster id"
            )));
        }
        let mut id = self.id.write().unwrap_or_else(|p| p.into_inner());
        match id.as_deref() {
            Some(mine) if mine == theirs => Ok(()),
            Some(mine) => denied(format!(
                "this node belongs to cluster {mine}, the message to cluster {theirs}"
            )),
            None => {
                write_id(&self.path, theirs).map_err(|e| {
                    tracing::error!("failed to keep the cluster id {theirs}: {e}");
                    Status::unavailable(format!("failed to keep the cluster id: {e}"))
                })?;
                tracing::info!(cluster_id = %theirs, "joined cluster");
                *id = Some(theirs.to_string());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_an_id_adopts_the_first_and_then_refuses_others() {
        let dir = tempfile::tempdir().expect("dir");
        let identity = ClusterIdentity::load(dir.path()).expect("load");
        assert_eq!(identity.id(), None);
        identity.admit(None).expect("no id on either side");
        let first = new_id();
        identity.admit(Some(&first)).expect("adopted");
        assert_eq!(identity.id().as_deref(), Some(first.as_str()));
        let again = ClusterIdentity::load(dir.path()).expect("reload");
        assert_eq!(again.id(), identity.id(), "the adopted id is kept on disk");
        let other = new_id();
        let refused = again.admit(Some(&other)).expect_err("another cluster");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains(&other), "{}", refused.message());
        let unnamed = again.admit(None).expect_err("a message without an id");
        assert_eq!(unnamed.code(), tonic::Code::PermissionDenied);
        again.admit(Some(&first)).expect("its own cluster");
    }

    #[test]
    fn forwarded_calls_are_refused_from_other_clusters_and_never_adopted() {
        let dir = tempfile::tempdir().expect("dir");
        let identity = ClusterIdentity::load(dir.path()).expect("load");
        let stranger = new_id();
        identity
            .admit_forwarded(Some(&stranger))
            .expect("a node without an id refuses nothing");
        assert_eq!(identity.id(), None, "a forwarded call never makes a member");
        let mine = identity.form().expect("form");
        identity
            .admit_forwarded(Some(&mine))
            .expect("its own cluster");
        for presented in [Some(stranger.as_str()), None] {
            let refused = identity
                .admit_forwarded(presented)
                .expect_err("another cluster, or none");
            assert_eq!(refused.code(), tonic::Code::PermissionDenied);
            assert!(refused.message().contains(&mine), "{}", refused.message());
        }
    }

    #[test]
    fn forming_keeps_an_id_it_has_and_a_restore_makes_a_new_one() {
        let dir = tempfile::tempdir().expect("dir");
        let restored = ClusterIdentity::create_new(dir.path()).expect("restore");
        assert!(valid_cluster_id(&restored));
        assert!(ClusterIdentity::create_new(dir.path()).is_err());
        let identity = ClusterIdentity::load(dir.path()).expect("load");
        assert_eq!(identity.form().expect("form"), restored);

        let fresh = tempfile::tempdir().expect("dir");
        let identity = ClusterIdentity::load(fresh.path()).expect("load");
        let formed = identity.form().expect("form");
        assert_ne!(formed, restored);
        assert_eq!(
            ClusterIdentity::load(fresh.path()).expect("reload").id(),
            Some(formed)
        );
    }

    #[test]
    fn a_malformed_file_is_an_error_not_an_empty_id() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(CLUSTER_ID_FILE), "not-an-id").expect("write");
        assert!(matches!(
            ClusterIdentity::load(dir.path()),
            Err(IdentityError::Malformed { .. })
        ));
    }
}
