//! Generates the gRPC code from `proto/` with protox (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed.

use std::path::PathBuf;

use prost::Message;

/// The public protocol, served (and described by reflection) on the client port.
const ORISUN_PROTOS: [&str; 2] = ["orisun/eventstore.proto", "orisun/admin.proto"];
/// Cairn's own services between nodes and for operators, on the peer port.
const CAIRN_PROTOS: [&str; 2] = ["cairn/v1/raft.proto", "cairn/v1/cluster.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for proto in ORISUN_PROTOS.iter().chain(&CAIRN_PROTOS) {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Separate descriptor sets, so each port's reflection lists only what that port serves.
    let orisun = protox::compile(ORISUN_PROTOS, [&root])?;
    std::fs::write(out.join("orisun_descriptor.bin"), orisun.encode_to_vec())?;
    let cairn = protox::compile(CAIRN_PROTOS, [&root])?;
    std::fs::write(out.join("cairn_descriptor.bin"), cairn.encode_to_vec())?;
    for fds in [orisun, cairn] {
        tonic_prost_build::configure()
            .codec_path("crate::codec::StrictProstCodec")
            .compile_fds(fds)?;
    }
    Ok(())
}
