//! The protocol, package `opjournal.v1`: its generated code is the `opjournal-proto` crate's
//! (with the server stubs), re-exported here; what the server's reflection serves is this
//! crate's own (`build.rs`).

pub use opjournal_proto::*;

/// The encoded `FileDescriptorSet` of every proto the server exposes, for gRPC reflection
/// (built by `build.rs`; it holds at least the protocol's own, [`opjournal_proto::FILE_DESCRIPTOR_SET`]).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("opjournal_descriptor");

/// The gRPC services the server serves, fully qualified.
pub const SERVICES: &[&str] = &["opjournal.v1.OperationJournal", "opjournal.v1.Reconciler"];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prost::Message as _;

    fn files(set: &[u8]) -> Vec<prost_types::FileDescriptorProto> {
        prost_types::FileDescriptorSet::decode(set).unwrap().file
    }

    #[test]
    fn reflection_describes_the_protocol_and_every_served_service() {
        let served = files(super::FILE_DESCRIPTOR_SET);
        for file in files(opjournal_proto::FILE_DESCRIPTOR_SET) {
            assert!(served.contains(&file), "{} is not served", file.name());
        }
        for service in super::SERVICES {
            let (package, name) = service.rsplit_once('.').unwrap();
            assert!(
                served.iter().any(|file| file.package() == package
                    && file.service.iter().any(|s| s.name() == name)),
                "{service} is not described"
            );
        }
    }
}
