//! Generated protobuf and gRPC code for package `opjournal.v1`.

#![allow(missing_docs, clippy::all)]

tonic::include_proto!("opjournal.v1");

/// The encoded `FileDescriptorSet` of every proto the server exposes, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("opjournal_descriptor");

/// The gRPC services the server serves, fully qualified.
pub const SERVICES: &[&str] = &["opjournal.v1.OperationJournal", "opjournal.v1.Reconciler"];
