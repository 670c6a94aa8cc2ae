//! Compiles the journal's contract from the repository's `proto/` with protox (no system
//! `protoc`) and generates the messages and the gRPC client stubs; no server code.

const PROTO_ROOT: &str = "../../proto";
const PROTOS: &[&str] = &["../../proto/opjournal/v1/journal.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let descriptors = protox::compile(PROTOS, [PROTO_ROOT])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
