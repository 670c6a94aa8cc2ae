//! Compiles the protocol in the repository's `proto/` with protox (no system `protoc`) and
//! generates, once for every crate of the workspace, the messages and the gRPC client stubs,
//! with the `server` feature the server stubs too; writes the encoded descriptor set next to
//! them.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTO_ROOT: &str = "../../proto";
const PROTOS: &[&str] = &[
    "../../proto/opjournal/v1/journal.proto",
    "../../proto/opjournal/v1/provider_adapter.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let descriptors = protox::compile(PROTOS, [PROTO_ROOT])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("opjournal_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(env::var_os("CARGO_FEATURE_SERVER").is_some())
        .compile_fds(descriptors)?;
    Ok(())
}
