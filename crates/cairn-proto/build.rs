//! Generates the gRPC code from `proto/` with protox (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed.

use std::path::PathBuf;

use prost::Message;

const PROTOS: [&str; 4] = [
    "orisun/eventstore.proto",
    "orisun/admin.proto",
    "cairn/v1/raft.proto",
    "cairn/v1/cluster.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let fds = protox::compile(PROTOS, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictProstCodec")
        .compile_fds(fds)?;
    Ok(())
}
