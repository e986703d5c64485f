//! A lean unary gRPC caller straight over one HTTP/2 connection (plaintext only).
//!
//! The load generator shares the machine with the node it measures, so every microsecond it
//! spends per request is taken from the server. tonic's `Channel` hands each request through
//! a buffer task, hyper's dispatch task and a spawned body-pipe task before h2 sees it; here
//! the calling task writes its frames into the shared h2 connection itself, and the
//! connection task only moves bytes. The wire format is exactly gRPC's: a 5-byte
//! length-prefixed protobuf message, `application/grpc`, status in the trailers (or in the
//! headers of a trailers-only response).

use std::sync::{Arc, RwLock};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Method, Request, Uri};
use tonic::metadata::AsciiMetadataValue;
use tonic::{Code, Status};

/// Largest response accepted (the tonic transport's decoding limit, for the same reason:
/// a 1,000-event page is far below it, a runaway server is not).
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;
/// Bytes of a gRPC message prefix: compression flag and big-endian length.
const PREFIX_BYTES: usize = 5;
/// Receive windows, as hyper's HTTP/2 client (and so tonic) sets them: a 1,000-event page
/// (~400 KB) then arrives without waiting for window updates.
const STREAM_WINDOW_BYTES: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u32 = 5 * 1024 * 1024;

/// One HTTP/2 connection, shared by the clients of a run.
#[derive(Clone)]
pub struct DirectChannel {
    send: SendRequest<Bytes>,
    scheme: Scheme,
    authority: Authority,
    /// The credentials header (name, value) the login settled on, shared with the tonic
    /// clients of the same connection.
    auth: Arc<RwLock<(&'static str, AsciiMetadataValue)>>,
}

impl DirectChannel {
    /// Connects to a plaintext `http://host:port` endpoint.
    pub async fn connect(
        endpoint: &str,
        auth: Arc<RwLock<(&'static str, AsciiMetadataValue)>>,
    ) -> anyhow::Result<DirectChannel> {
        let uri: Uri = endpoint
            .parse()
            .with_context(|| format!("invalid endpoint {endpoint:?}"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            anyhow::bail!("the direct transport speaks plaintext HTTP/2 only, not {endpoint}");
        }
        let authority = uri
            .authority()
            .cloned()
            .with_context(|| format!("endpoint {endpoint} has no host:port"))?;
        let tcp = tokio::net::TcpStream::connect(authority.as_str())
            .await
            .with_context(|| format!("failed to connect to {endpoint}"))?;
        tcp.set_nodelay(true)
            .with_context(|| format!("failed to set TCP_NODELAY towards {endpoint}"))?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .handshake(tcp)
            .await
            .with_context(|| format!("HTTP/2 handshake with {endpoint} failed"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("HTTP/2 connection closed: {e}");
            }
        });
        Ok(DirectChannel {
            send,
            scheme: Scheme::HTTP,
            authority,
            auth,
        })
    }

    /// Calls unary method `path` (e.g. `/orisun.EventStore/SaveEventsV2`).
    pub async fn unary<Req, Resp>(&self, path: &'static str, request: &Req) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(PathAndQuery::from_static(path))
            .build()
            .map_err(|e| Status::internal(format!("bad request URI: {e}")))?;
        let (auth_name, auth_value) = self.auth.read().unwrap_or_else(|p| p.into_inner()).clone();
        let auth_value = HeaderValue::from_maybe_shared(Bytes::from(auth_value))
            .map_err(|e| Status::internal(format!("bad credentials header: {e}")))?;
        let head = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(auth_name, auth_value)
            .body(())
            .map_err(|e| Status::internal(format!("bad request: {e}")))?;

        let len = request.encoded_len();
        let mut body = BytesMut::with_capacity(PREFIX_BYTES + len);
        body.put_u8(0);
        body.put_u32(u32::try_from(len).map_err(|_| Status::out_of_range("request too large"))?);
        request
            .encode(&mut body)
            .map_err(|e| Status::internal(format!("failed to encode request: {e}")))?;

        let mut send = self.send.clone().ready().await.map_err(h2_status)?;
        let (response, mut stream) = send.send_request(head, false).map_err(h2_status)?;
        stream.send_data(body.freeze(), true).map_err(h2_status)?;
        let (parts, mut body) = response.await.map_err(h2_status)?.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(Status::unknown(format!("HTTP status {}", parts.status)));
        }
        // Trailers-only response: the status is in the headers and there is no message.
        if parts.headers.contains_key("grpc-status") {
            return Err(status_of(&parts.headers)
                .unwrap_or_else(|| Status::internal("OK response without a message")));
        }
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_status)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if message.len() + chunk.len() > PREFIX_BYTES + MAX_RESPONSE_BYTES {
                return Err(Status::out_of_range("response larger than 256 MiB"));
            }
            message.extend_from_slice(&chunk);
        }
        match body.trailers().await.map_err(h2_status)? {
            Some(trailers) => {
                if let Some(status) = status_of(&trailers) {
                    return Err(status);
                }
                if trailers.get("grpc-status").is_none() {
                    return Err(Status::internal("response trailers carry no grpc-status"));
                }
            }
            None => return Err(Status::internal("response ended without trailers")),
        }
        decode(&message)
    }
}

/// The error status of a header block, or `None` when it reports OK (or nothing).
fn status_of(headers: &http::HeaderMap) -> Option<Status> {
    match headers.get("grpc-status") {
        Some(code) if code.as_bytes() == b"0" => None,
        Some(_) => Status::from_header_map(headers),
        None => None,
    }
}

/// The one message of a unary response body.
fn decode<Resp: prost::Message + Default>(body: &[u8]) -> Result<Resp, Status> {
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return Err(Status::internal("response has no message"));
    };
    if prefix[0] != 0 {
        return Err(Status::internal("compressed responses are not supported"));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if rest.len() != len {
        return Err(Status::internal(format!(
            "response message is {} bytes, its prefix says {len}",
            rest.len()
        )));
    }
    Resp::decode(rest).map_err(|e| Status::internal(format!("failed to decode response: {e}")))
}

/// A connection-level failure as the status a gRPC client would report.
fn h2_status(e: h2::Error) -> Status {
    match e.reason() {
        Some(reason) if e.is_remote() => Status::new(
            Code::Unavailable,
            format!("stream reset by server: {reason}"),
        ),
        _ => Status::new(Code::Unavailable, format!("HTTP/2 error: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::orisun as pb;
    use prost::Message;

    fn framed(message: &impl Message) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.encoded_len() as u32).to_be_bytes());
        message.encode(&mut out).expect("encode");
        out
    }

    #[test]
    fn a_framed_message_decodes_and_a_damaged_one_does_not() {
        let reply = pb::WriteResult {
            log_position: Some(pb::Position {
                commit_position: 7,
                prepare_position: 6,
            }),
            write_id: "7".into(),
        };
        let body = framed(&reply);
        assert_eq!(decode::<pb::WriteResult>(&body).expect("decodes"), reply);
        assert!(decode::<pb::WriteResult>(&body[..body.len() - 1]).is_err());
        assert!(decode::<pb::WriteResult>(&body[..3]).is_err());
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert!(decode::<pb::WriteResult>(&compressed).is_err());
    }

    #[test]
    fn statuses_come_from_grpc_status_headers() {
        let mut headers = http::HeaderMap::new();
        assert!(status_of(&headers).is_none());
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(status_of(&headers).is_none());
        headers.insert("grpc-status", HeaderValue::from_static("6"));
        headers.insert("grpc-message", HeaderValue::from_static("conflict%20here"));
        let status = status_of(&headers).expect("an error");
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(status.message(), "conflict here");
    }
}
