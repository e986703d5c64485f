//! The connection: one lazily connected channel per endpoint, credentials on every call,
//! failover to the next endpoint when one does not answer.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine;
use cairn_core::{Criterion, Position};
use cairn_proto::cairn_v1 as cairn_pb;
use cairn_proto::cairn_v1::boundaries_client::BoundariesClient;
use cairn_proto::convert::criterion_to_wire;
use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use rand::Rng;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

use crate::config::{ClientConfig, KEEP_ALIVE_INTERVAL};
use crate::types::{BoundaryInfo, Event, Latest, NewEvent, Observation, ReadRequest, WriteResult};
use crate::{Error, types};

/// Request header of HTTP Basic credentials.
const AUTHORIZATION: &str = "authorization";
/// Request and response header of a session token.
const TOKEN_HEADER: &str = "x-auth-token";
/// Largest reply accepted: a full page of 10,000 large events fits, a runaway server not.
const MAX_REPLY_BYTES: usize = 256 * 1024 * 1024;
/// Largest page [`Client::get_events`] may ask for (the server's limit).
pub const MAX_PAGE: u32 = 10_000;

/// Whether a call may be repeated on another endpoint after an unanswered attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads and other calls that change nothing.
    Safe,
    /// Writes: a lost reply leaves their outcome open, so the caller decides.
    Never,
}

/// A Cairn client. Cheap to clone: clones share connections, the session token and the
/// endpoint currently in use.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.config.endpoints)
            .field("current", &self.inner.current.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    channels: Vec<Channel>,
    current: AtomicUsize,
    basic: Option<AsciiMetadataValue>,
    token: RwLock<Option<AsciiMetadataValue>>,
    /// Whether each boundary asked about has idempotent event ids.
    idempotent: Mutex<HashMap<String, bool>>,
}

fn endpoint(config: &ClientConfig, uri: &str) -> Result<Endpoint, Error> {
    let endpoint = Endpoint::from_shared(uri.to_string())
        .map_err(|e| Error::Config(format!("invalid endpoint {uri:?}: {e}")))?
        .connect_timeout(config.connect_timeout)
        .timeout(config.request_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(config.connect_timeout)
        .keep_alive_while_idle(true);
    if uri.starts_with("https://") {
        return tls(endpoint, config, uri);
    }
    // tonic would quietly speak plaintext to an http:// endpoint despite a CA: a client that
    // was told to verify a server must not send it credentials in clear.
    if config.tls_ca_pem.is_some() || config.tls_identity.is_some() {
        return Err(Error::Config(format!(
            "TLS settings were given, but {uri} is not an https:// endpoint"
        )));
    }
    Ok(endpoint)
}

#[cfg(feature = "tls")]
fn tls(endpoint: Endpoint, config: &ClientConfig, uri: &str) -> Result<Endpoint, Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = match &config.tls_ca_pem {
        Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let Some((cert, key)) = &config.tls_identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    endpoint
        .tls_config(tls)
        .map_err(|e| Error::Config(format!("TLS for {uri}: {e}")))
}

#[cfg(not(feature = "tls"))]
fn tls(_endpoint: Endpoint, _config: &ClientConfig, uri: &str) -> Result<Endpoint, Error> {
    Err(Error::Config(format!(
        "{uri} needs TLS, and this cairn-client was built without its `tls` feature"
    )))
}

impl Client {
    /// A client for `config`'s endpoints. Connections open on first use, so this succeeds
    /// while servers are down; call [`Client::ping`] to wait for one. Must be called within
    /// a Tokio runtime.
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        if config.endpoints.is_empty() {
            return Err(Error::Config("no endpoints".into()));
        }
        let channels = config
            .endpoints
            .iter()
            .map(|uri| endpoint(&config, uri).map(|e| e.connect_lazy()))
            .collect::<Result<Vec<_>, _>>()?;
        let basic = match &config.credentials {
            Some((user, password)) => {
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Some(
                    format!("Basic {encoded}")
                        .parse()
                        .map_err(|_| Error::Config("credentials are not ASCII".into()))?,
                )
            }
            None => None,
        };
        let start = if config.random_start {
            rand::thread_rng().gen_range(0..channels.len())
        } else {
            0
        };
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                channels,
                current: AtomicUsize::new(start),
                basic,
                token: RwLock::new(None),
                idempotent: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// [`Client::new`], then [`Client::ping`]: returns once a server answered and accepted
    /// the credentials.
    pub async fn connect(config: ClientConfig) -> Result<Client, Error> {
        let client = Client::new(config)?;
        client.ping().await?;
        Ok(client)
    }

    /// The endpoint calls go to now.
    pub fn current_endpoint(&self) -> &str {
        let index = self.inner.current.load(Ordering::Relaxed);
        &self.inner.config.endpoints[index]
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The endpoint to use and its channel.
    pub(crate) fn pick(&self) -> (usize, Channel) {
        let index = self.inner.current.load(Ordering::Relaxed);
        (index, self.inner.channels[index].clone())
    }

    /// Moves off endpoint `index` (unless another call already did).
    pub(crate) fn rotate(&self, index: usize) {
        let next = (index + 1) % self.inner.channels.len();
        let _ =
            self.inner
                .current
                .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Adds the credentials (and the session token, once known) to a request.
    pub(crate) fn authorize(&self, metadata: &mut MetadataMap) {
        if let Some(basic) = &self.inner.basic {
            metadata.insert(AUTHORIZATION, basic.clone());
        }
        if let Some(token) = self
            .inner
            .token
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            // The server prefers a valid token and falls back to Basic when it has expired.
            metadata.insert(TOKEN_HEADER, token.clone());
        }
    }

    /// Keeps the session token a reply carries.
    pub(crate) fn adopt_token(&self, metadata: &MetadataMap) {
        let Some(token) = metadata.get(TOKEN_HEADER) else {
            return;
        };
        let mut slot = self.inner.token.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref() != Some(token) {
            *slot = Some(token.clone());
        }
    }

    /// The pause before retry number `attempt` (1-based): doubling, capped, jittered.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let config = &self.inner.config;
        let doubled = config
            .min_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let ceiling = doubled.min(config.max_backoff);
        ceiling.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
    }

    /// One unary call with credentials, failing over to the next endpoint while the call
    /// is safe to repeat and goes unanswered.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        retry: Retry,
        request: &Req,
        send: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (index, channel) = self.pick();
            let mut call = tonic::Request::new(request.clone());
            self.authorize(call.metadata_mut());
            match send(channel, call).await {
                Ok(reply) => {
                    self.adopt_token(reply.metadata());
                    return Ok(reply.into_inner());
                }
                Err(status) => {
                    let error = Error::from_status(&status);
                    if !error.is_ambiguous() {
                        return Err(error);
                    }
                    tracing::debug!(
                        endpoint = %self.inner.config.endpoints[index],
                        %error,
                        "call unanswered; moving to the next endpoint"
                    );
                    self.rotate(index);
                    if retry == Retry::Never || attempt >= self.inner.config.read_attempts {
                        return Err(error);
                    }
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
            }
        }
    }

    fn event_store(channel: Channel) -> EventStoreClient<Channel> {
        EventStoreClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES)
    }

    /// Checks that a server answers and accepts the credentials.
    pub async fn ping(&self) -> Result<(), Error> {
        self.call(Retry::Safe, &pb::PingRequest {}, |ch, r| async move {
            Self::event_store(ch).ping(r).await
        })
        .await
        .map(|_| ())
    }

    /// Appends `events` to `boundary` if every observation still holds (none: always).
    ///
    /// Not retried: after an [ambiguous](Error::is_ambiguous) failure the write may have
    /// been committed. [`Client::decide`] resolves that; a caller of this method must too.
    pub async fn append(
        &self,
        boundary: &str,
        events: &[NewEvent],
        observations: &[Observation],
    ) -> Result<WriteResult, Error> {
        let request = pb::SaveEventsV2Request {
            boundary: boundary.to_string(),
            events: events.iter().map(NewEvent::to_wire).collect(),
            consistency: observations.iter().map(Observation::to_wire).collect(),
        };
        self.save(&request).await
    }

    /// The deprecated single-condition write (`SaveEvents`), for code written against it:
    /// `condition` is the observation the write needs to hold (none: unconditional).
    /// Prefer [`Client::append`]. Not retried, like it.
    pub async fn append_legacy(
        &self,
        boundary: &str,
        events: &[NewEvent],
        condition: Option<&Observation>,
    ) -> Result<WriteResult, Error> {
        let request = pb::SaveEventsRequest {
            boundary: boundary.to_string(),
            query: condition.map(|o| pb::SaveQuery {
                expected_position: Some(cairn_proto::convert::position_to_wire(o.position)),
                subset_query: Some(cairn_proto::convert::query_to_wire(&o.query)),
            }),
            events: events.iter().map(NewEvent::to_wire).collect(),
        };
        let result = self
            .call(Retry::Never, &request, |ch, r| async move {
                Self::event_store(ch).save_events(r).await
            })
            .await?;
        WriteResult::from_wire(result)
    }

    /// SaveEventsV2 with a request built once, so that every attempt sends the same bytes.
    pub(crate) async fn save(
        &self,
        request: &pb::SaveEventsV2Request,
    ) -> Result<WriteResult, Error> {
        let result = self
            .call(Retry::Never, request, |ch, r| async move {
                Self::event_store(ch).save_events_v2(r).await
            })
            .await?;
        WriteResult::from_wire(result)
    }

    /// One page of events.
    pub async fn get_events(&self, request: &ReadRequest) -> Result<Vec<Event>, Error> {
        let reply = self
            .call(Retry::Safe, &request.to_wire(), |ch, r| async move {
                Self::event_store(ch).get_events(r).await
            })
            .await?;
        reply.events.into_iter().map(Event::from_wire).collect()
    }

    /// Every event of `boundary` matching `query` (every event without one) after position
    /// `after` (from the start without one), oldest first, read page by page.
    pub async fn read_all(
        &self,
        boundary: &str,
        query: Option<&cairn_core::Query>,
        after: Option<Position>,
    ) -> Result<Vec<Event>, Error> {
        let mut events: Vec<Event> = Vec::new();
        let mut from = after;
        loop {
            let page = self
                .get_events(&ReadRequest {
                    boundary: boundary.to_string(),
                    query: query.cloned(),
                    from,
                    count: MAX_PAGE,
                    direction: types::Direction::Ascending,
                })
                .await?;
            let full = page.len() == MAX_PAGE as usize;
            // The start is inclusive: drop the event the previous page ended with (or the
            // one `after` names).
            events.extend(page.into_iter().filter(|e| Some(e.position) != from));
            if !full {
                return Ok(events);
            }
            from = events.last().map(|e| e.position);
        }
    }

    /// The newest event of each criterion, and the context position they make up.
    pub async fn latest_by_criteria(
        &self,
        boundary: &str,
        criteria: &[Criterion],
    ) -> Result<Latest, Error> {
        let request = pb::GetLatestByCriteriaRequest {
            boundary: boundary.to_string(),
            criteria: criteria.iter().map(criterion_to_wire).collect(),
        };
        let reply = self
            .call(Retry::Safe, &request, |ch, r| async move {
                Self::event_store(ch).get_latest_by_criteria(r).await
            })
            .await?;
        let events = reply
            .results
            .into_iter()
            .map(|r| r.event.map(Event::from_wire).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Latest {
            events,
            context_position: types::position_from(
                reply.context_position.as_ref(),
                "GetLatestByCriteria reply",
            )?,
        })
    }

    /// The observations the write `write_id` committed with.
    pub async fn write_context(
        &self,
        boundary: &str,
        write_id: &str,
    ) -> Result<Vec<Observation>, Error> {
        let request = pb::GetWriteContextRequest {
            boundary: boundary.to_string(),
            write_id: write_id.to_string(),
        };
        let reply = self
            .call(Retry::Safe, &request, |ch, r| async move {
                Self::event_store(ch).get_write_context(r).await
            })
            .await?;
        reply
            .consistency
            .into_iter()
            .map(|o| {
                let position = types::position_from(o.position.as_ref(), "write context")?;
                Ok(Observation {
                    query: cairn_proto::convert::query_from_wire(o.query),
                    position,
                })
            })
            .collect()
    }

    /// What the server says about itself.
    pub async fn server_info(&self) -> Result<pb::GetServerInfoResponse, Error> {
        self.call(
            Retry::Safe,
            &pb::GetServerInfoRequest {},
            |ch, r| async move { Self::event_store(ch).get_server_info(r).await },
        )
        .await
    }

    /// Creates a secondary index (ADMIN).
    pub async fn create_index(&self, request: pb::CreateIndexRequest) -> Result<(), Error> {
        self.call(Retry::Never, &request, |ch, r| async move {
            Self::event_store(ch).create_index(r).await
        })
        .await
        .map(|_| ())
    }

    /// Drops a secondary index (ADMIN).
    pub async fn drop_index(&self, request: pb::DropIndexRequest) -> Result<(), Error> {
        self.call(Retry::Never, &request, |ch, r| async move {
            Self::event_store(ch).drop_index(r).await
        })
        .await
        .map(|_| ())
    }

    /// The indexes of a boundary.
    pub async fn list_indexes(&self, boundary: &str) -> Result<Vec<pb::IndexDefinition>, Error> {
        let request = pb::ListIndexesRequest {
            boundary: boundary.to_string(),
        };
        let reply = self
            .call(Retry::Safe, &request, |ch, r| async move {
                Self::event_store(ch).list_indexes(r).await
            })
            .await?;
        Ok(reply.indexes)
    }

    /// One index of a boundary.
    pub async fn get_index(
        &self,
        boundary: &str,
        name: &str,
    ) -> Result<Option<pb::IndexDefinition>, Error> {
        let request = pb::GetIndexRequest {
            boundary: boundary.to_string(),
            name: name.to_string(),
        };
        let reply = self
            .call(Retry::Safe, &request, |ch, r| async move {
                Self::event_store(ch).get_index(r).await
            })
            .await?;
        Ok(reply.index)
    }

    /// Creates a boundary with Cairn's options (ADMIN; `cairn.v1.Boundaries`). Idempotent
    /// event ids are fixed at creation.
    pub async fn create_boundary(
        &self,
        name: &str,
        description: &str,
        idempotent_event_ids: bool,
    ) -> Result<BoundaryInfo, Error> {
        let request = cairn_pb::CreateBoundaryRequest {
            name: name.to_string(),
            description: description.to_string(),
            options: Some(cairn_pb::BoundaryOptions {
                idempotent_event_ids,
            }),
        };
        let reply = self
            .call(Retry::Never, &request, |ch, r| async move {
                BoundariesClient::new(ch).create_boundary(r).await
            })
            .await?;
        boundary_from_wire(reply.boundary)
    }

    /// A boundary with Cairn's options (`cairn.v1.Boundaries`).
    pub async fn boundary(&self, name: &str) -> Result<BoundaryInfo, Error> {
        let request = cairn_pb::GetBoundaryRequest {
            name: name.to_string(),
        };
        let reply = self
            .call(Retry::Safe, &request, |ch, r| async move {
                BoundariesClient::new(ch).get_boundary(r).await
            })
            .await?;
        boundary_from_wire(reply.boundary)
    }

    /// Whether `boundary` has idempotent event ids, asked once and remembered (the option
    /// is fixed at creation). A server without Cairn's extension has none.
    pub(crate) async fn idempotent(&self, boundary: &str) -> Result<bool, Error> {
        if let Some(known) = self
            .inner
            .idempotent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(boundary)
        {
            return Ok(*known);
        }
        let idempotent = match self.boundary(boundary).await {
            Ok(info) => info.idempotent_event_ids,
            Err(Error::Unimplemented(_)) => false,
            // The write itself will report a missing boundary precisely.
            Err(Error::NotFound(_) | Error::BoundaryNotActive { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        self.inner
            .idempotent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(boundary.to_string(), idempotent);
        Ok(idempotent)
    }
}

fn boundary_from_wire(boundary: Option<cairn_pb::Boundary>) -> Result<BoundaryInfo, Error> {
    let b =
        boundary.ok_or_else(|| Error::InvalidResponse("a reply without its boundary".into()))?;
    Ok(BoundaryInfo {
        name: b.name,
        description: b.description,
        idempotent_event_ids: b.options.is_some_and(|o| o.idempotent_event_ids),
        status: b.status,
        event_count: b.event_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_carry_basic_credentials_and_then_the_session_token() {
        let client =
            Client::new(ClientConfig::new(["http://127.0.0.1:1"]).credentials("ada", "secret"))
                .expect("client");
        let mut first = MetadataMap::new();
        client.authorize(&mut first);
        assert_eq!(
            first.get(AUTHORIZATION).map(|v| v.to_str().expect("ascii")),
            Some("Basic YWRhOnNlY3JldA==")
        );
        assert!(first.get(TOKEN_HEADER).is_none());
        let mut reply = MetadataMap::new();
        reply.insert(TOKEN_HEADER, "t-1".parse().expect("ascii"));
        client.adopt_token(&reply);
        let mut later = MetadataMap::new();
        client.clone().authorize(&mut later);
        assert_eq!(
            later.get(TOKEN_HEADER).map(|v| v.to_str().expect("ascii")),
            Some("t-1")
        );
        // Basic stays alongside: the server falls back to it once the token has expired.
        assert!(later.get(AUTHORIZATION).is_some());
    }

    #[tokio::test]
    async fn retries_back_off_up_to_the_ceiling() {
        let client = Client::new(
            ClientConfig::new(["http://127.0.0.1:1"])
                .backoff(Duration::from_millis(10), Duration::from_millis(100)),
        )
        .expect("client");
        for attempt in 1..40 {
            let pause = client.backoff(attempt);
            let ceiling = (Duration::from_millis(10) * 2u32.pow(attempt.min(20) - 1))
                .min(Duration::from_millis(100));
            assert!(
                pause <= ceiling && pause >= ceiling / 2,
                "{attempt}: {pause:?}"
            );
        }
    }

    #[tokio::test]
    async fn endpoints_are_checked_up_front() {
        assert!(matches!(
            Client::new(ClientConfig::new(Vec::<String>::new())),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Client::new(ClientConfig::new(["not a uri"])),
            Err(Error::Config(_))
        ));
    }
}
