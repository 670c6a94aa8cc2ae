//! The opjournal protocol, package `opjournal.v1` (the repository's `proto/`), for Rust: the
//! messages, the gRPC client stubs (`operation_journal_client`, `reconciler_client`,
//! `provider_adapter_client`), with the `server` feature the server stubs
//! (`operation_journal_server`, `reconciler_server`, `provider_adapter_server`), and the
//! encoded descriptor set. Generated once, here: the server (`opjournal::proto`) and the Rust
//! client (`opjournal_client::proto`) both use this crate.
//!
//! Without the `server` feature the crate needs only tonic's client side, so a client's
//! dependency tree holds no server code.

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("opjournal.v1");
}

pub use generated::*;

/// The encoded `FileDescriptorSet` of the protocol (`journal.proto`,
/// `provider_adapter.proto`), as compiled for this crate.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("opjournal_descriptor");
