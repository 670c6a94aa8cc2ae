//! The protocol's messages and gRPC client stubs, package `opjournal.v1`: the
//! `opjournal-proto` crate, without its server stubs.

pub use opjournal_proto::*;
