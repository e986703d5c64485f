//! `cairn-proto-gen [--check]`: compiles `proto/` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc`) into `crates/cairn-proto/src/generated/`.
//!
//! The generated code is committed rather than produced by a build script, so a build of
//! Cairn does not compile a protobuf compiler and a code generator first (a minute of a
//! cold build on two cores). `--check` regenerates into a scratch directory and fails if
//! anything differs from what is committed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use prost::Message;

/// The public protocol, served (and described by reflection) on the client port.
const ORISUN_PROTOS: [&str; 2] = ["orisun/eventstore.proto", "orisun/admin.proto"];
/// Cairn's own services between nodes and for operators, on the peer port.
const CAIRN_PEER_PROTOS: [&str; 2] = ["cairn/v1/raft.proto", "cairn/v1/cluster.proto"];
/// Cairn's extensions on the client port.
const CAIRN_CLIENT_PROTOS: [&str; 3] = [
    "cairn/v1/boundaries.proto",
    "cairn/v1/tokens.proto",
    "cairn/v1/backup.proto",
];

fn generate(root: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out)?;
    let proto_dir = root.join("proto");
    // Separate descriptor sets, so each port's reflection lists only what that port serves.
    for (protos, descriptor) in [
        (&ORISUN_PROTOS[..], "orisun_descriptor.bin"),
        (&CAIRN_PEER_PROTOS[..], "cairn_descriptor.bin"),
        (&CAIRN_CLIENT_PROTOS[..], "cairn_client_descriptor.bin"),
    ] {
        let fds = protox::compile(protos.iter(), [&proto_dir])?;
        std::fs::write(out.join(descriptor), fds.encode_to_vec())?;
    }
    // Code: one module per package, so all of `cairn.v1` is compiled together.
    let cairn: Vec<&str> = CAIRN_PEER_PROTOS
        .iter()
        .chain(&CAIRN_CLIENT_PROTOS)
        .copied()
        .collect();
    for protos in [&ORISUN_PROTOS[..], &cairn[..]] {
        let fds = protox::compile(protos.iter(), [&proto_dir])?;
        tonic_prost_build::configure()
            .codec_path("crate::codec::StrictProstCodec")
            .out_dir(out)
            .compile_fds(fds)?;
    }
    Ok(())
}

fn files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let check = std::env::args().skip(1).any(|a| a == "--check");
    // `cargo run` reports the crate's directory at run time too: a binary built in another
    // checkout sharing the target directory (CI's) then still reads this checkout's protos.
    let manifest_dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let root = PathBuf::from(manifest_dir).join("../..");
    let committed = root.join("crates/cairn-proto/src/generated");
    if !check {
        generate(&root, &committed)?;
        println!("regenerated {}", committed.display());
        return Ok(true);
    }
    let scratch = std::env::temp_dir().join(format!("cairn-proto-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    generate(&root, &scratch)?;
    let mut same = files(&scratch)? == files(&committed)?;
    for name in files(&scratch)? {
        let fresh = std::fs::read(scratch.join(&name))?;
        let kept = std::fs::read(committed.join(&name)).unwrap_or_default();
        if fresh != kept {
            eprintln!("{name} differs from what proto/ generates");
            same = false;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if !same {
        eprintln!("crates/cairn-proto/src/generated is stale: run `make proto` and commit it");
    }
    Ok(same)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
