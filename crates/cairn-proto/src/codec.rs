//! The protobuf codec of every Cairn service: tonic-prost's, except that a request body
//! that does not decode is the client's fault (`INVALID_ARGUMENT`), not a server fault.
//!
//! tonic maps prost decode errors to `INTERNAL`, following gRPC library convention. Cairn's
//! contract reserves `INTERNAL` for real server faults, so the decoder re-labels them.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Prost codec with client-error decode statuses.
#[derive(Debug, Clone, Copy)]
pub struct StrictProstCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictProstCodec<T, U> {
    fn default() -> Self {
        StrictProstCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for StrictProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder {
            inner: ProstDecoder::new(BufferSettings::default()),
        }
    }
}

/// Decoder that reports undecodable messages as `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct StrictDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|status| {
            if status.code() == Code::Internal {
                Status::invalid_argument(format!(
                    "malformed protobuf message: {}",
                    status.message()
                ))
            } else {
                status
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}
