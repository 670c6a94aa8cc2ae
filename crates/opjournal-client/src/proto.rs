//! Generated messages and gRPC client stubs of package `opjournal.v1` (`journal.proto`).

#![allow(missing_docs, clippy::all)]

tonic::include_proto!("opjournal.v1");
