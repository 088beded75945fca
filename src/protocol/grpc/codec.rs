//! The protobuf codec of the generated gRPC code: tonic-prost's, except that a message
//! that does not decode is the sender's mistake (INVALID_ARGUMENT with what failed),
//! not the INTERNAL error tonic-prost reports for it.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Encodes `T` and decodes `U` with prost.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

/// Decodes `U`, turning decode failures into INVALID_ARGUMENT.
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>, PhantomData<U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(ProstCodec::default())
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(self.0.decoder(), PhantomData)
    }
}

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => {
                let what = std::any::type_name::<U>().rsplit("::").next().unwrap_or("message");
                Status::invalid_argument(format!("the gRPC message is not a valid {what}: {}", status.message()))
            }
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
