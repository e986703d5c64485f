//! The start-up writes: the session-token key, the bootstrap admin user, the admin
//! boundary, the `--boundaries` and the `--idempotent-boundaries`. They are proposed by
//! whichever node leads, each time a node becomes leader, and only what the replicated
//! catalog still lacks, so a cluster writes them once and a restart or a leader change
//! writes nothing. A node serves once it has applied the token key (it authenticates with
//! it), which is proposed last. Declared boundaries come from the leader's configuration:
//! members of one cluster share theirs.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Error;
use cairn_core::command::Command;
use rand::RngCore;
use tokio::task::JoinHandle;

use crate::admin::create_user;
use crate::config::{ServeConfig, defaults};
use crate::state::NodeState;

/// Description of the admin boundary in the catalog.
const ADMIN_BOUNDARY_DESCRIPTION: &str = "admin boundary (B5): Orisun clients read it in their start-up health check; Cairn keeps its catalog outside boundaries, so it holds only what clients write";
/// Description of a boundary declared with `--boundaries`.
const DECLARED_BOUNDARY_DESCRIPTION: &str = "declared in server configuration";
/// Pause before a leader retries start-up writes that failed.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How often a node still waiting for the start-up state says so.
const WAITING_NOTICE_INTERVAL: Duration = Duration::from_secs(10);

/// A boundary the configuration declares.
struct Declared {
    name: String,
    description: &'static str,
    idempotent_event_ids: bool,
}

/// What the catalog still lacks of the start-up state.
struct Missing {
    token_key: bool,
    admin_user: bool,
    boundaries: Vec<Declared>,
    /// Declared with idempotent event ids but created without them (the option is fixed at
    /// creation).
    plain_but_declared_idempotent: Vec<String>,
}

fn declared(config: &ServeConfig) -> Vec<Declared> {
    let admin = &config.admin_boundary;
    let mut declared = vec![Declared {
        name: admin.clone(),
        description: ADMIN_BOUNDARY_DESCRIPTION,
        idempotent_event_ids: config.idempotent_boundaries.contains(admin),
    }];
    // The config keeps the two lists disjoint.
    let plain = config.boundaries.iter().map(|name| (name, false));
    let idempotent = config.idempotent_boundaries.iter().map(|name| (name, true));
    for (name, idempotent_event_ids) in plain.chain(idempotent) {
        if name != admin {
            declared.push(Declared {
                name: name.clone(),
                description: DECLARED_BOUNDARY_DESCRIPTION,
                idempotent_event_ids,
            });
        }
    }
    declared
}

fn missing(node: &NodeState) -> Missing {
    let config = &node.config;
    let declared = declared(config);
    node.store().with_catalog(|c| {
        let plain_but_declared_idempotent = declared
            .iter()
            .filter(|d| {
                d.idempotent_event_ids
                    && c.boundaries
                        .get(&d.name)
                        .is_some_and(|b| !b.idempotent_event_ids)
            })
            .map(|d| d.name.clone())
            .collect();
        Missing {
            token_key: c.token_key.is_none(),
            admin_user: c.user_by_name(&config.admin_username).is_none(),
            boundaries: declared
                .into_iter()
                .filter(|d| !c.boundaries.contains_key(&d.name))
                .collect(),
            plain_but_declared_idempotent,
        }
    })
}

/// Proposes what the catalog lacks. Run by the leader, after a read barrier so that it sees
/// everything committed before it led. Every command is idempotent on apply as well, so two
/// leaders in quick succession cannot create anything twice.
async fn propose_missing(node: &NodeState) -> Result<(), Error> {
    node.raft.read_barrier().await?;
    let missing = missing(node);
    // The admin user is part of the first start only (whose last write is the token key):
    // once that finished, a deleted admin stays deleted, and a changed --admin-username or
    // --admin-password changes nothing (users are managed through the Admin API).
    if missing.admin_user && missing.token_key {
        let config = &node.config;
        create_user(
            node,
            "Administrator".to_string(),
            config.admin_username.clone(),
            config.admin_password.clone(),
            &["ADMIN".to_string()],
            true,
        )
        .await?;
    }
    for boundary in missing.boundaries {
        node.router
            .execute(Command::CreateBoundary {
                name: boundary.name,
                description: boundary.description.to_string(),
                placement: None,
                existed_before_catalog: false,
                idempotent_event_ids: boundary.idempotent_event_ids,
                if_absent: true,
            })
            .await?;
    }
    for name in missing.plain_but_declared_idempotent {
        tracing::warn!(
            "boundary \"{name}\" is in --idempotent-boundaries but was created without idempotent event ids; \
             the option is fixed when a boundary is created, so its writes keep Orisun's behaviour (duplicate ids are stored)"
        );
    }
    // Last: a node serves once it has the token key, and log order then guarantees it has
    // the admin user and the boundaries of the first start as well.
    if missing.token_key {
        let mut key = vec![0u8; cairn_core::auth::TOKEN_KEY_BYTES];
        rand::thread_rng().fill_bytes(&mut key);
        node.router.execute(Command::InitTokenKey { key }).await?;
    }
    Ok(())
}

/// Watches this node's leadership and proposes the missing start-up writes each time it
/// begins to lead (retrying while it leads, if they fail).
pub fn spawn(node: Arc<NodeState>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut leader = node.raft.watch_leader();
        let mut done_in_this_term = false;
        loop {
            leader.borrow_and_update();
            if node.raft.is_leader() {
                if !done_in_this_term {
                    match propose_missing(&node).await {
                        Ok(()) => done_in_this_term = true,
                        Err(e) => {
                            tracing::warn!("failed to propose the start-up writes, retrying: {e}");
                            tokio::time::sleep(RETRY_INTERVAL).await;
                            continue;
                        }
                    }
                }
            } else {
                done_in_this_term = false;
            }
            if leader.changed().await.is_err() {
                return;
            }
        }
    })
}

/// Warns, loudly, when the admin user's stored password is the public default, whatever
/// the flags say now: the flag only sets the password of the first start, so checking it
/// would miss a node started with the default once and a password flag since, and cry
/// wolf about one whose admin password was changed through the Admin API.
pub async fn warn_if_default_admin_password(node: &NodeState) {
    let username = node.config.admin_username.clone();
    let Some(user) = node
        .store()
        .with_catalog(|c| c.user_by_name(&username).cloned())
    else {
        return;
    };
    let is_default = tokio::task::spawn_blocking(move || {
        crate::password::verify(&user.password_hash, defaults::ADMIN_PASSWORD)
    })
    .await
    .unwrap_or(false);
    if is_default {
        tracing::warn!(
            "THE PASSWORD OF ADMIN USER \"{username}\" IS THE PUBLIC DEFAULT \"{}\": change it (Admin/ChangePassword) before exposing this node",
            defaults::ADMIN_PASSWORD
        );
    }
}

/// Waits until this node has applied the session-token key (it cannot authenticate anyone
/// before), saying every few seconds what it is waiting for.
pub async fn wait_until_ready(node: &NodeState) -> Result<(), Error> {
    let mut metrics = node.raft.raft().metrics();
    let mut notice = tokio::time::Instant::now() + WAITING_NOTICE_INTERVAL;
    loop {
        if node.store().with_catalog(|c| c.token_key.is_some()) {
            return Ok(());
        }
        match tokio::time::timeout_at(notice, metrics.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Error::Unavailable("raft stopped while starting".into())),
            Err(_) => {
                notice += WAITING_NOTICE_INTERVAL;
                match node.raft.leader() {
                    Some(leader) => tracing::info!(
                        leader = leader.id,
                        "waiting for the start-up writes to reach this node"
                    ),
                    None => tracing::info!("waiting for a leader to be elected"),
                }
            }
        }
    }
}
