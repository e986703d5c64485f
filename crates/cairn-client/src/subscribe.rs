//! Catch-up subscriptions as a [`Stream`] that survives disconnects: after a lost
//! connection, a node's shutdown or a failover, it subscribes again (on the next endpoint)
//! from the last position it delivered, so the caller sees every event once, in order.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use cairn_core::{Position, Query};
use cairn_proto::convert::{position_to_wire, query_to_wire};
use cairn_proto::orisun as pb;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use futures::Stream;
use tokio::sync::mpsc;

use crate::{Client, Error, Event};

/// Events buffered between the connection and a slow consumer; beyond it the subscription
/// stops reading from the server (which then holds back, too).
const BUFFER: usize = 256;

/// What to follow: see [`Client::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    /// Boundary to follow.
    pub boundary: String,
    /// Filter; `None` follows every event.
    pub query: Option<Query>,
    /// Exclusive start: [`Position::BEGINNING`] for everything; `None` starts with the newest
    /// matching event.
    pub after: Option<Position>,
    /// Name of the subscription: one holder per name and boundary at a time, cluster-wide.
    pub subscriber_name: String,
}

/// The events of a subscription, as they arrive: [`Client::subscribe`].
///
/// Ends after an error it cannot resume from (credentials, a gone boundary, another holder
/// of the name when it first subscribes, or no server for the resume timeout); that error
/// is its last item. Dropping it ends the subscription on the server.
pub struct EventStream {
    events: mpsc::Receiver<Result<Event, Error>>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl Stream for EventStream {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

impl Client {
    /// Subscribes: stored events first, then new ones as they are written. The stream
    /// resumes by itself after a disconnect, from the last event it delivered.
    pub fn subscribe(&self, request: SubscribeRequest) -> EventStream {
        let (tx, rx) = mpsc::channel(BUFFER);
        tokio::spawn(follow(self.clone(), request, tx));
        EventStream { events: rx }
    }
}

/// Why one connection's subscription ended.
enum Ended {
    /// The consumer dropped the stream.
    Dropped,
    /// The connection or the server went away: subscribe again. `opened` says whether the
    /// server had accepted the subscription (a new outage) or refused it (the same one).
    Resume { error: Error, opened: bool },
    /// A refusal no retry changes.
    Fatal(Error),
}

/// The subscription's owner task: one server stream at a time, resumed until it cannot be.
async fn follow(client: Client, request: SubscribeRequest, tx: mpsc::Sender<Result<Event, Error>>) {
    let mut after = request.after;
    let mut down_since: Option<Instant> = None;
    let mut attempt = 0u32;
    loop {
        let ended = follow_once(&client, &request, &mut after, &tx, down_since.is_some()).await;
        let error = match ended {
            Ended::Dropped => return,
            Ended::Fatal(error) => {
                let _ = tx.send(Err(error)).await;
                return;
            }
            Ended::Resume { error, opened } => {
                if opened {
                    down_since = None;
                    attempt = 0;
                }
                error
            }
        };
        let since = *down_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= client.config().resume_timeout {
            let _ = tx
                .send(Err(Error::Unavailable(format!(
                    "subscription {:?} on boundary {:?} could not resume for {:?}: {error}",
                    request.subscriber_name,
                    request.boundary,
                    client.config().resume_timeout
                ))))
                .await;
            return;
        }
        tracing::debug!(
            subscriber = %request.subscriber_name,
            after = ?after,
            %error,
            "subscription interrupted; resuming"
        );
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(client.backoff(attempt)) => {}
            _ = tx.closed() => return,
        }
    }
}

/// Subscribes once and forwards events until the stream ends; `after` tracks the last
/// delivered position. `resuming` tells a lease still held by our own broken stream (the
/// server frees it once it notices, or when it expires) from another holder's.
async fn follow_once(
    client: &Client,
    request: &SubscribeRequest,
    after: &mut Option<Position>,
    tx: &mpsc::Sender<Result<Event, Error>>,
    resuming: bool,
) -> Ended {
    let (index, channel) = client.pick();
    let mut call = tonic::Request::new(pb::CatchUpSubscribeToEventStoreRequest {
        after_position: after.map(position_to_wire),
        query: request.query.as_ref().map(query_to_wire),
        subscriber_name: request.subscriber_name.clone(),
        boundary: request.boundary.clone(),
    });
    client.authorize(call.metadata_mut());
    let mut store = EventStoreClient::new(channel);
    let opened = tokio::select! {
        opened = store.catch_up_subscribe_to_events(call) => opened,
        _ = tx.closed() => return Ended::Dropped,
    };
    let classify = |status: tonic::Status, opened: bool| {
        let error = Error::from_status(&status);
        match error {
            _ if error.is_ambiguous() => {
                client.rotate(index);
                Ended::Resume { error, opened }
            }
            Error::AlreadyExists(_) if resuming => Ended::Resume { error, opened },
            _ => Ended::Fatal(error),
        }
    };
    let mut stream = match opened {
        Ok(reply) => {
            client.adopt_token(reply.metadata());
            reply.into_inner()
        }
        Err(status) => return classify(status, false),
    };
    loop {
        let next = tokio::select! {
            next = stream.message() => next,
            _ = tx.closed() => return Ended::Dropped,
        };
        match next {
            Ok(Some(event)) => {
                let event = match Event::from_wire(event) {
                    Ok(event) => event,
                    Err(error) => return Ended::Fatal(error),
                };
                *after = Some(event.position);
                if tx.send(Ok(event)).await.is_err() {
                    return Ended::Dropped;
                }
            }
            // A server ends a subscription only when it shuts down: go on elsewhere.
            Ok(None) => {
                client.rotate(index);
                return Ended::Resume {
                    error: Error::Unavailable("the server ended the stream".into()),
                    opened: true,
                };
            }
            Err(status) => return classify(status, true),
        }
    }
}
