//! `orisun.Admin`: the boundary catalog and users.

use cairn_core::Error;
use cairn_core::auth::{Role, UserRecord};
use cairn_core::boundary::{BoundaryInfo, validate_boundary_name};
use cairn_core::command::{Applied, Command};
use cairn_core::limits::{MAX_PASSWORD_BYTES, MAX_USERNAME_BYTES};
use cairn_proto::convert::{boundary_to_wire, placement_from_wire, user_to_wire};
use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_server::Admin;
use cairn_proto::to_status;
use tonic::{Request, Response, Status};

use crate::auth::Principal;
use crate::rpc::{node_of, reply};
use crate::state::{NodeState, Ready};

/// The Admin service.
#[derive(Clone)]
pub struct AdminService {
    ready: Ready,
}

impl AdminService {
    /// A service answering UNAVAILABLE until `ready` is set.
    pub fn new(ready: Ready) -> Self {
        AdminService { ready }
    }
}

fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| {
            to_status(Error::Unauthenticated(
                "request was not authenticated".to_string(),
            ))
        })
}

fn parse_roles(roles: &[String]) -> Result<Vec<Role>, Error> {
    let mut parsed = roles
        .iter()
        .map(|r| Role::parse(r))
        .collect::<Result<Vec<_>, _>>()?;
    parsed.sort();
    parsed.dedup();
    Ok(parsed)
}

fn check_password_shape(password: &str, what: &str) -> Result<(), Error> {
    if password.is_empty() {
        return Err(Error::invalid(format!("{what} is empty")));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(Error::invalid(format!(
            "{what} is longer than {MAX_PASSWORD_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Creates a user (also used for the bootstrap admin with `if_absent`).
pub async fn create_user(
    node: &NodeState,
    name: String,
    username: String,
    password: String,
    roles: &[String],
    if_absent: bool,
) -> Result<UserRecord, Error> {
    if username.is_empty() || username.len() > MAX_USERNAME_BYTES || username.contains(':') {
        return Err(Error::invalid(format!(
            "username must be 1-{MAX_USERNAME_BYTES} bytes without ':'"
        )));
    }
    if name.len() > MAX_USERNAME_BYTES {
        return Err(Error::invalid(format!(
            "name is longer than {MAX_USERNAME_BYTES} bytes"
        )));
    }
    check_password_shape(&password, "password")?;
    let roles = parse_roles(roles)?;
    let user = UserRecord {
        user_id: uuid::Uuid::new_v4().to_string(),
        name,
        username,
        password_hash: node.auth.hash_password(password).await?,
        roles,
        // Stamped by the leader's proposer.
        created_unix_nanos: 0,
        updated_unix_nanos: 0,
        credential_generation: 0,
    };
    match node
        .router
        .execute(Command::CreateUser { user, if_absent })
        .await?
    {
        Applied::User(user) => Ok(user),
        other => Err(Error::internal(format!("unexpected outcome {other:?}"))),
    }
}

/// The boundary named `name`, as of a linearizable read (NOT_FOUND when there is none).
pub(crate) async fn find_boundary(node: &NodeState, name: &str) -> Result<BoundaryInfo, Error> {
    validate_boundary_name(name)?;
    node.router.read_barrier().await?;
    node.store()
        .with_catalog(|c| c.boundaries.get(name).cloned())
        .ok_or_else(|| Error::NotFound(format!("boundary \"{name}\" not found")))
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_boundary(
        &self,
        request: Request<pb::CreateBoundaryRequest>,
    ) -> Result<Response<pb::CreateBoundaryResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            validate_boundary_name(&req.name)?;
            let applied = node
                .router
                .execute(Command::CreateBoundary {
                    name: req.name,
                    description: req.description,
                    placement: placement_from_wire(req.placement),
                    existed_before_catalog: req.existed_before_catalog,
                    idempotent_event_ids: false,
                    if_absent: false,
                })
                .await?;
            match applied {
                Applied::Boundary(b) => Ok(pb::CreateBoundaryResponse {
                    boundary: Some(boundary_to_wire(&b)),
                }),
                other => Err(Error::internal(format!("unexpected outcome {other:?}"))),
            }
        }
        .await;
        reply(result)
    }

    async fn list_boundaries(
        &self,
        _request: Request<pb::ListBoundariesRequest>,
    ) -> Result<Response<pb::ListBoundariesResponse>, Status> {
        let node = node_of(&self.ready)?;
        let result = async {
            node.router.read_barrier().await?;
            let boundaries = node
                .store()
                .with_catalog(|c| c.boundaries.values().map(boundary_to_wire).collect());
            Ok(pb::ListBoundariesResponse { boundaries })
        }
        .await;
        reply(result)
    }

    async fn get_boundary(
        &self,
        request: Request<pb::GetBoundaryRequest>,
    ) -> Result<Response<pb::GetBoundaryResponse>, Status> {
        let node = node_of(&self.ready)?;
        let name = request.into_inner().name;
        let result = find_boundary(&node, &name)
            .await
            .map(|b| pb::GetBoundaryResponse {
                boundary: Some(boundary_to_wire(&b)),
            });
        reply(result)
    }

    async fn create_user(
        &self,
        request: Request<pb::CreateUserRequest>,
    ) -> Result<Response<pb::CreateUserResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = create_user(
            &node,
            req.name,
            req.username,
            req.password,
            &req.roles,
            false,
        )
        .await
        .map(|u| pb::CreateUserResponse {
            user: Some(user_to_wire(&u)),
        });
        reply(result)
    }

    async fn delete_user(
        &self,
        request: Request<pb::DeleteUserRequest>,
    ) -> Result<Response<pb::DeleteUserResponse>, Status> {
        let node = node_of(&self.ready)?;
        let caller = principal(&request)?;
        let user_id = request.into_inner().user_id;
        let result = async {
            if user_id == caller.user_id {
                return Err(Error::FailedPrecondition(
                    "you cannot delete your own user".into(),
                ));
            }
            node.router.execute(Command::DeleteUser { user_id }).await?;
            Ok(pb::DeleteUserResponse { success: true })
        }
        .await;
        reply(result)
    }

    async fn change_password(
        &self,
        request: Request<pb::ChangePasswordRequest>,
    ) -> Result<Response<pb::ChangePasswordResponse>, Status> {
        let node = node_of(&self.ready)?;
        let caller = principal(&request)?;
        let req = request.into_inner();
        let result = async {
            if req.user_id != caller.user_id {
                return Err(Error::PermissionDenied(
                    "you can only change your own password".into(),
                ));
            }
            check_password_shape(&req.new_password, "new_password")?;
            node.router.read_barrier().await?;
            let user = node
                .store()
                .with_catalog(|c| c.users.get(&req.user_id).cloned())
                .ok_or_else(|| Error::NotFound(format!("user \"{}\" not found", req.user_id)))?;
            if !node
                .auth
                .check_password(&user, &req.current_password)
                .await?
            {
                return Err(Error::Unauthenticated("current password is wrong".into()));
            }
            node.router
                .execute(Command::SetPassword {
                    user_id: req.user_id,
                    password_hash: node.auth.hash_password(req.new_password).await?,
                    at_unix_nanos: 0, // stamped by the leader's proposer
                })
                .await?;
            Ok(pb::ChangePasswordResponse { success: true })
        }
        .await;
        reply(result)
    }

    async fn list_users(
        &self,
        _request: Request<pb::ListUsersRequest>,
    ) -> Result<Response<pb::ListUsersResponse>, Status> {
        let node = node_of(&self.ready)?;
        let result = async {
            node.router.read_barrier().await?;
            let mut users: Vec<UserRecord> = node
                .store()
                .with_catalog(|c| c.users.values().cloned().collect());
            users.sort_by(|a, b| a.username.cmp(&b.username));
            Ok(pb::ListUsersResponse {
                users: users.iter().map(user_to_wire).collect(),
            })
        }
        .await;
        reply(result)
    }

    async fn validate_credentials(
        &self,
        request: Request<pb::ValidateCredentialsRequest>,
    ) -> Result<Response<pb::ValidateCredentialsResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            node.router.read_barrier().await?;
            let Some(user) = node
                .store()
                .with_catalog(|c| c.user_by_name(&req.username).cloned())
            else {
                return Ok(pb::ValidateCredentialsResponse {
                    success: false,
                    user: None,
                });
            };
            let ok = node.auth.check_password(&user, &req.password).await?;
            Ok(pb::ValidateCredentialsResponse {
                success: ok,
                user: ok.then(|| user_to_wire(&user)),
            })
        }
        .await;
        reply(result)
    }

    async fn get_user_count(
        &self,
        _request: Request<pb::GetUserCountRequest>,
    ) -> Result<Response<pb::GetUserCountResponse>, Status> {
        let node = node_of(&self.ready)?;
        let result = async {
            node.router.read_barrier().await?;
            let count = node.store().with_catalog(|c| c.users.len() as i64);
            Ok(pb::GetUserCountResponse { count })
        }
        .await;
        reply(result)
    }

    async fn get_event_count(
        &self,
        request: Request<pb::GetEventCountRequest>,
    ) -> Result<Response<pb::GetEventCountResponse>, Status> {
        let node = node_of(&self.ready)?;
        let boundary = request.into_inner().boundary;
        let result = async {
            validate_boundary_name(&boundary)?;
            node.router.read_barrier().await?;
            let b = node.active_boundary(&boundary)?;
            Ok(pb::GetEventCountResponse {
                count: node.store().event_count(b.id) as i64,
            })
        }
        .await;
        reply(result)
    }
}
