//! `cairn.v1.Boundaries`: boundaries with Cairn's options (client port, beside
//! `orisun.Admin`, same credentials).

use cairn_core::Error;
use cairn_core::boundary::{BoundaryInfo, validate_boundary_name};
use cairn_core::command::{Applied, Command};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::boundaries_server::Boundaries;
use cairn_proto::convert::boundary_to_cairn_wire;
use tonic::{Request, Response, Status};

use crate::admin::find_boundary;
use crate::rpc::{node_of, reply};
use crate::state::{NodeState, Ready};

/// The Boundaries service.
#[derive(Clone)]
pub struct BoundariesService {
    ready: Ready,
}

impl BoundariesService {
    /// A service answering UNAVAILABLE until `ready` is set.
    pub fn new(ready: Ready) -> Self {
        BoundariesService { ready }
    }
}

fn to_wire(node: &NodeState, b: &BoundaryInfo) -> pb::Boundary {
    boundary_to_cairn_wire(b, node.store().event_count(b.id))
}

#[tonic::async_trait]
impl Boundaries for BoundariesService {
    async fn create_boundary(
        &self,
        request: Request<pb::CreateBoundaryRequest>,
    ) -> Result<Response<pb::CreateBoundaryResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            validate_boundary_name(&req.name)?;
            let options = req.options.unwrap_or_default();
            let applied = node
                .router
                .execute(Command::CreateBoundary {
                    name: req.name,
                    description: req.description,
                    placement: None,
                    existed_before_catalog: false,
                    idempotent_event_ids: options.idempotent_event_ids,
                    if_absent: false,
                })
                .await?;
            match applied {
                Applied::Boundary(b) => Ok(pb::CreateBoundaryResponse {
                    boundary: Some(to_wire(&node, &b)),
                }),
                other => Err(Error::internal(format!("unexpected outcome {other:?}"))),
            }
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
                boundary: Some(to_wire(&node, &b)),
            });
        reply(result)
    }

    async fn list_boundaries(
        &self,
        _request: Request<pb::ListBoundariesRequest>,
    ) -> Result<Response<pb::ListBoundariesResponse>, Status> {
        let node = node_of(&self.ready)?;
        let result = async {
            node.router.read_barrier().await?;
            let boundaries = node.store().with_catalog(|c| {
                c.boundaries
                    .values()
                    .map(|b| boundary_to_cairn_wire(b, c.head(b.id)))
                    .collect()
            });
            Ok(pb::ListBoundariesResponse { boundaries })
        }
        .await;
        reply(result)
    }
}
