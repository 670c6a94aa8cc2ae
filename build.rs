//! The descriptor set the server's gRPC reflection serves (`proto::FILE_DESCRIPTOR_SET`):
//! the protos of `proto/` the server exposes, compiled with protox (no system `protoc`). The
//! Rust code generated from them is the `opjournal-proto` crate's, shared with the client.

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
    Ok(())
}
