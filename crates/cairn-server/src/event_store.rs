//! `orisun.EventStore`: writes with CCC, reads, subscriptions, indexes, info.

use cairn_core::boundary::validate_boundary_name;
use cairn_core::command::{Append, Applied, Command};
use cairn_core::event::validate_events;
use cairn_core::limits::MAX_READ_COUNT;
use cairn_core::position::parse_write_id;
use cairn_core::query::{normalize_latest_criteria, normalize_observations};
use cairn_core::{Error, Observation, Position, Query};
use cairn_proto::convert::{
    criterion_from_wire, event_to_wire, index_from_wire, index_to_wire, observation_from_wire,
    observation_to_wire, position_from_wire, position_to_wire, query_from_wire,
    raw_event_from_wire,
};
use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_server::EventStore;
use cairn_proto::to_status;
use cairn_store::{Direction, PageLimit, ReadStart};
use tonic::{Request, Response, Status};

use crate::rpc::{node_of, reply};
use crate::state::{NodeState, Ready};
use crate::subscription;

/// Version reported by GetServerInfo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Source revision baked in at build time (or "unknown").
pub const GIT_COMMIT: &str = match option_env!("CAIRN_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};
/// Build time baked in at build time (or "unknown").
pub const BUILD_TIME: &str = match option_env!("CAIRN_BUILD_TIME") {
    Some(t) => t,
    None => "unknown",
};

/// The EventStore service.
#[derive(Clone)]
pub struct EventStoreService {
    ready: Ready,
}

impl EventStoreService {
    /// A service answering UNAVAILABLE until `ready` is set.
    pub fn new(ready: Ready) -> Self {
        EventStoreService { ready }
    }
}

fn note_boundary(name: &str) {
    tracing::Span::current().record("boundary", name);
}

/// Appends under observations (C1–C5) and counts the outcome.
async fn save(
    node: &NodeState,
    boundary: String,
    raw_events: Vec<pb::EventToSave>,
    observations: Vec<Observation>,
) -> Result<pb::WriteResult, Error> {
    note_boundary(&boundary);
    node.active_boundary_for_write(&boundary).await?;
    let events = validate_events(
        raw_events.into_iter().map(raw_event_from_wire).collect(),
        node.config.max_event_bytes,
    )?;
    let observations = normalize_observations(observations)?;
    let count = events.len() as u64;
    let outcome = node
        .router
        .propose(Command::Append(Append {
            boundary: boundary.clone(),
            observations,
            events,
            at_unix_nanos: 0, // stamped by the leader's proposer
        }))
        .await?;
    match outcome {
        Ok(Applied::Appended { last }) => {
            let m = &node.metrics;
            m.writes_committed.with_label_values(&[&boundary]).inc();
            m.events_committed
                .with_label_values(&[&boundary])
                .inc_by(count);
            Ok(pb::WriteResult {
                log_position: Some(position_to_wire(last)),
                write_id: last.write_id(),
            })
        }
        Ok(other) => Err(Error::internal(format!(
            "append produced an unexpected outcome: {other:?}"
        ))),
        Err(conflict @ Error::Conflict { .. }) => {
            node.metrics.conflicts.with_label_values(&[&boundary]).inc();
            Err(conflict)
        }
        Err(e) => Err(e),
    }
}

fn direction_from_wire(d: i32) -> Result<Direction, Error> {
    match pb::Direction::try_from(d) {
        Ok(pb::Direction::Asc) => Ok(Direction::Asc),
        Ok(pb::Direction::Desc) => Ok(Direction::Desc),
        Err(_) => Err(Error::invalid(format!(
            "direction {d} is not ASC (0) or DESC (1)"
        ))),
    }
}

async fn get_events(
    node: &NodeState,
    req: pb::GetEventsRequest,
) -> Result<pb::GetEventsResponse, Error> {
    note_boundary(&req.boundary);
    validate_boundary_name(&req.boundary)?;
    node.router.read_barrier().await?;
    let boundary = node.active_boundary(&req.boundary)?;
    if req.count == 0 || req.count > MAX_READ_COUNT {
        return Err(Error::invalid(format!(
            "count must be between 1 and {MAX_READ_COUNT}, got {}",
            req.count
        )));
    }
    let direction = direction_from_wire(req.direction)?;
    let query: Query = query_from_wire(req.query).normalize_filter()?;
    let start = match req.from_position.as_ref() {
        Some(p) => ReadStart::Inclusive(position_from_wire(p)),
        None => ReadStart::Edge,
    };
    let limit = PageLimit {
        events: req.count as usize,
        bytes: node.config.max_response_bytes,
    };
    let events = node
        .blocking(move |s| s.read_events(boundary.id, &query, start, direction, limit))
        .await?;
    Ok(pb::GetEventsResponse {
        events: events.into_iter().map(event_to_wire).collect(),
    })
}

async fn latest_by_criteria(
    node: &NodeState,
    req: pb::GetLatestByCriteriaRequest,
) -> Result<pb::GetLatestByCriteriaResponse, Error> {
    note_boundary(&req.boundary);
    validate_boundary_name(&req.boundary)?;
    let echoed = req.criteria.clone();
    let criteria =
        normalize_latest_criteria(req.criteria.into_iter().map(criterion_from_wire).collect())?;
    node.router.read_barrier().await?;
    let boundary = node.active_boundary(&req.boundary)?;
    let (results, context) = node
        .blocking(move |s| s.latest_by_criteria(boundary.id, &criteria))
        .await?;
    Ok(pb::GetLatestByCriteriaResponse {
        results: echoed
            .into_iter()
            .zip(results)
            .map(|(criterion, event)| pb::LatestCriterionResult {
                criterion: Some(criterion),
                event: event.map(event_to_wire),
            })
            .collect(),
        context_position: Some(position_to_wire(context)),
    })
}

async fn write_context(
    node: &NodeState,
    req: pb::GetWriteContextRequest,
) -> Result<pb::WriteContext, Error> {
    note_boundary(&req.boundary);
    validate_boundary_name(&req.boundary)?;
    let last: Position = parse_write_id(&req.write_id)?;
    node.router.read_barrier().await?;
    let boundary = node.active_boundary(&req.boundary)?;
    let found = node
        .blocking(move |s| s.write_context(boundary.id, last))
        .await?;
    match found {
        Some(observations) => Ok(pb::WriteContext {
            write_id: req.write_id,
            consistency: observations.iter().map(observation_to_wire).collect(),
        }),
        None => Err(Error::NotFound(format!(
            "write \"{}\" not found in boundary \"{}\"",
            req.write_id, req.boundary
        ))),
    }
}

#[tonic::async_trait]
impl EventStore for EventStoreService {
    async fn save_events(
        &self,
        request: Request<pb::SaveEventsRequest>,
    ) -> Result<Response<pb::WriteResult>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        // C6: a subset query with criteria is one observation; none is unconditional.
        let observations = match req.query {
            Some(q) => match q.subset_query {
                Some(subset) if !subset.criteria.is_empty() => vec![Observation {
                    query: query_from_wire(Some(subset)),
                    position: q
                        .expected_position
                        .as_ref()
                        .map_or(Position::NONE, position_from_wire),
                }],
                _ => Vec::new(),
            },
            None => Vec::new(),
        };
        reply(save(&node, req.boundary, req.events, observations).await)
    }

    async fn save_events_v2(
        &self,
        request: Request<pb::SaveEventsV2Request>,
    ) -> Result<Response<pb::WriteResult>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        validate_boundary_name(&req.boundary).map_err(to_status)?;
        let observations = req
            .consistency
            .into_iter()
            .enumerate()
            .map(|(i, o)| observation_from_wire(o, i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_status)?;
        reply(save(&node, req.boundary, req.events, observations).await)
    }

    async fn get_write_context(
        &self,
        request: Request<pb::GetWriteContextRequest>,
    ) -> Result<Response<pb::WriteContext>, Status> {
        let node = node_of(&self.ready)?;
        reply(write_context(&node, request.into_inner()).await)
    }

    async fn get_events(
        &self,
        request: Request<pb::GetEventsRequest>,
    ) -> Result<Response<pb::GetEventsResponse>, Status> {
        let node = node_of(&self.ready)?;
        reply(get_events(&node, request.into_inner()).await)
    }

    async fn get_latest_by_criteria(
        &self,
        request: Request<pb::GetLatestByCriteriaRequest>,
    ) -> Result<Response<pb::GetLatestByCriteriaResponse>, Status> {
        let node = node_of(&self.ready)?;
        reply(latest_by_criteria(&node, request.into_inner()).await)
    }

    type CatchUpSubscribeToEventsStream = subscription::EventStream;

    async fn catch_up_subscribe_to_events(
        &self,
        request: Request<pb::CatchUpSubscribeToEventStoreRequest>,
    ) -> Result<Response<Self::CatchUpSubscribeToEventsStream>, Status> {
        let node = node_of(&self.ready)?;
        let principal = request
            .extensions()
            .get::<crate::auth::Principal>()
            .cloned()
            .ok_or_else(|| {
                to_status(Error::Unauthenticated(
                    "request was not authenticated".to_string(),
                ))
            })?;
        reply(subscription::open(node, &principal, request.into_inner()).await)
    }

    async fn ping(
        &self,
        _request: Request<pb::PingRequest>,
    ) -> Result<Response<pb::PingResponse>, Status> {
        node_of(&self.ready)?;
        Ok(Response::new(pb::PingResponse {}))
    }

    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        let node = node_of(&self.ready)?;
        use pb::ServerCapability as Cap;
        Ok(Response::new(pb::GetServerInfoResponse {
            version: VERSION.to_string(),
            git_commit: GIT_COMMIT.to_string(),
            build_time: BUILD_TIME.to_string(),
            backend: pb::StorageBackend::Unspecified as i32,
            node_id: node.process_id.clone(),
            capabilities: [
                Cap::CommandContextConsistency,
                Cap::CatchUpSubscriptions,
                Cap::IndexManagement,
                Cap::BoundaryCatalog,
                Cap::GrpcHealth,
            ]
            .into_iter()
            .map(|c| c as i32)
            .collect(),
        }))
    }

    async fn create_index(
        &self,
        request: Request<pb::CreateIndexRequest>,
    ) -> Result<Response<pb::CreateIndexResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            note_boundary(&req.boundary);
            node.active_boundary_for_write(&req.boundary).await?;
            let boundary = req.boundary.clone();
            let index = index_from_wire(req)?;
            index.validate()?;
            node.router
                .execute(Command::CreateIndex { boundary, index })
                .await?;
            Ok(pb::CreateIndexResponse {})
        }
        .await;
        reply(result)
    }

    async fn drop_index(
        &self,
        request: Request<pb::DropIndexRequest>,
    ) -> Result<Response<pb::DropIndexResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            note_boundary(&req.boundary);
            node.active_boundary_for_write(&req.boundary).await?;
            node.router
                .execute(Command::DropIndex {
                    boundary: req.boundary,
                    name: req.name,
                })
                .await?;
            Ok(pb::DropIndexResponse {})
        }
        .await;
        reply(result)
    }

    async fn list_indexes(
        &self,
        request: Request<pb::ListIndexesRequest>,
    ) -> Result<Response<pb::ListIndexesResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            note_boundary(&req.boundary);
            validate_boundary_name(&req.boundary)?;
            node.router.read_barrier().await?;
            let boundary = node.active_boundary(&req.boundary)?;
            let indexes = node.store().with_catalog(|c| {
                c.indexes
                    .range((boundary.id, String::new())..)
                    .take_while(|((bid, _), _)| *bid == boundary.id)
                    .map(|(_, d)| index_to_wire(d))
                    .collect()
            });
            Ok(pb::ListIndexesResponse { indexes })
        }
        .await;
        reply(result)
    }

    async fn get_index(
        &self,
        request: Request<pb::GetIndexRequest>,
    ) -> Result<Response<pb::GetIndexResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            note_boundary(&req.boundary);
            validate_boundary_name(&req.boundary)?;
            node.router.read_barrier().await?;
            let boundary = node.active_boundary(&req.boundary)?;
            node.store()
                .with_catalog(|c| {
                    c.indexes
                        .get(&(boundary.id, req.name.clone()))
                        .map(index_to_wire)
                })
                .map(|index| pb::GetIndexResponse { index: Some(index) })
                .ok_or_else(|| {
                    Error::NotFound(format!(
                        "index \"{}\" not found in boundary \"{}\"",
                        req.name, req.boundary
                    ))
                })
        }
        .await;
        reply(result)
    }
}
