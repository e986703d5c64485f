//! Generated gRPC code for the Orisun protocol (`orisun`) and Cairn's own services
//! (`cairn.v1`), the conversions between wire and domain types, and the one mapping of
//! domain errors to gRPC status codes.

pub mod codec;
pub mod convert;
pub mod status;

// The generated code is committed (`make proto` regenerates it from proto/, and
// `make verify` fails when it has drifted): see tools/proto-gen.

/// The Orisun protocol (package `orisun`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod orisun {
    include!("generated/orisun.rs");
}

/// Cairn's internal services (package `cairn.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod cairn_v1 {
    include!("generated/cairn.v1.rs");
}

/// Encoded `FileDescriptorSet` of the Orisun services (client port reflection).
pub const ORISUN_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/orisun_descriptor.bin");
/// Encoded `FileDescriptorSet` of Cairn's own services (peer port reflection).
pub const CAIRN_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/cairn_descriptor.bin");
/// Encoded `FileDescriptorSet` of Cairn's extensions on the client port (`cairn.v1.Boundaries`,
/// `cairn.v1.Tokens`, `cairn.v1.Backup`).
pub const CAIRN_CLIENT_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!("generated/cairn_client_descriptor.bin");

/// Encoded `FileDescriptorSet` of `google.rpc`'s error details: reflection serves it so that
/// tools such as grpcurl can show the `ErrorInfo` detail of Cairn's structured errors.
pub const ERROR_DETAILS_FILE_DESCRIPTOR_SET: &[u8] = tonic_types::pb::FILE_DESCRIPTOR_SET;

/// Metadata key carrying the cluster secret on every `cairn.v1` call (peer port): nodes send
/// it to each other, and tools and the operator send it to any node.
pub const CLUSTER_SECRET_HEADER: &str = "x-cairn-cluster-secret";

pub use status::{from_status, to_status};
