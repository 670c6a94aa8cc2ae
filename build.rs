//! Compiles `proto/` with protox (no system `protoc`) and generates the tonic/prost code.
//! The encoded descriptor set is written next to the generated code for gRPC reflection.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/opjournal/v1/journal.proto",
    "proto/opjournal/v1/provider_adapter.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let descriptors = protox::compile(PROTOS, ["proto"])?;
    fs::write(
        out_dir.join("opjournal_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
