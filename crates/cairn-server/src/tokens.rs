//! `cairn.v1.Tokens`: rotating the session-token key (client port, ADMIN; see
//! [`crate::auth`] for how tokens of the replaced key are accepted meanwhile).

use std::time::Duration;

use cairn_core::Error;
use cairn_core::auth::TOKEN_KEY_BYTES;
use cairn_core::command::{Applied, Command, TokenKeyState};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::tokens_server::Tokens;
use rand::RngCore;
use tonic::{Request, Response, Status};

use crate::rpc::{node_of, reply};
use crate::state::Ready;

/// Grace period of a rotation that names none: the default token lifetime, so a client
/// whose token was handed out just before the rotation never sees it refused.
pub const DEFAULT_TOKEN_KEY_GRACE: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest grace period: a retired key accepted for longer is a key not rotated.
pub const MAX_TOKEN_KEY_GRACE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The Tokens service.
#[derive(Clone)]
pub struct TokensService {
    ready: Ready,
}

impl TokensService {
    /// A service answering UNAVAILABLE until `ready` is set.
    pub fn new(ready: Ready) -> Self {
        TokensService { ready }
    }
}

/// The grace period a request asks for, validated.
pub fn grace(requested_seconds: Option<u64>) -> Result<Duration, Error> {
    let grace = requested_seconds.map_or(DEFAULT_TOKEN_KEY_GRACE, Duration::from_secs);
    if grace > MAX_TOKEN_KEY_GRACE {
        return Err(Error::InvalidArgument(format!(
            "grace_seconds {} is longer than the longest grace period, {} s (a week)",
            grace.as_secs(),
            MAX_TOKEN_KEY_GRACE.as_secs()
        )));
    }
    Ok(grace)
}

fn seconds(unix_nanos: i64) -> i64 {
    unix_nanos.div_euclid(1_000_000_000)
}

fn to_wire(state: &TokenKeyState) -> pb::TokenKeyStatus {
    pb::TokenKeyStatus {
        generation: state.generation,
        rotated_at_unix_seconds: seconds(state.rotated_unix_nanos),
        previous_accepted_until_unix_seconds: seconds(state.previous_accepted_until_unix_nanos),
    }
}

#[tonic::async_trait]
impl Tokens for TokensService {
    async fn rotate_key(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<Response<pb::RotateKeyResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        let result = async {
            let grace = grace(req.grace_seconds)?;
            let mut key = vec![0u8; TOKEN_KEY_BYTES];
            rand::thread_rng().fill_bytes(&mut key);
            let applied = node
                .router
                .execute(Command::RotateTokenKey {
                    key,
                    // At most a week: far inside i64 nanoseconds.
                    grace_nanos: i64::try_from(grace.as_nanos()).unwrap_or(i64::MAX),
                    at_unix_nanos: 0,
                })
                .await?;
            match applied {
                Applied::TokenKeyRotated(state) => {
                    tracing::info!(
                        generation = state.generation,
                        grace_seconds = grace.as_secs(),
                        "session-token key rotated"
                    );
                    Ok(pb::RotateKeyResponse {
                        status: Some(to_wire(&state)),
                    })
                }
                other => Err(Error::internal(format!("unexpected outcome {other:?}"))),
            }
        }
        .await;
        reply(result)
    }

    async fn key_status(
        &self,
        _request: Request<pb::KeyStatusRequest>,
    ) -> Result<Response<pb::KeyStatusResponse>, Status> {
        let node = node_of(&self.ready)?;
        let result = async {
            node.router.read_barrier().await?;
            let state = node.store().with_catalog(|c| c.token_key_state.clone());
            Ok(pb::KeyStatusResponse {
                status: Some(to_wire(&state)),
            })
        }
        .await;
        reply(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_period_defaults_to_a_day_and_is_at_most_a_week() {
        assert_eq!(grace(None).expect("default"), DEFAULT_TOKEN_KEY_GRACE);
        assert_eq!(grace(Some(0)).expect("none"), Duration::ZERO);
        assert_eq!(grace(Some(604_800)).expect("a week"), MAX_TOKEN_KEY_GRACE);
        assert!(matches!(
            grace(Some(604_801)),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn times_are_whole_seconds_rounded_down() {
        assert_eq!(seconds(1_999_999_999), 1);
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(-1), -1);
    }
}
