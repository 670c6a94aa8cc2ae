//! What gRPC reflection describes: the services this server serves (never the
//! `ProviderAdapter` contract, which provider adapters implement and the reconcile worker
//! calls), health, and the `google.rpc` error details every error carries, so that a
//! reflection client (grpcurl) can decode `ErrorInfo`, `RetryInfo` and `BadRequest`.

use prost::Message as _;
use prost_types::FileDescriptorSet;

use crate::proto;

/// The protocol's files, without those that declare a service this server does not
/// serve, followed by the `google.rpc` status and error-detail files.
///
/// Errors: an embedded descriptor set does not decode (a build defect).
pub fn served_descriptors() -> Result<Vec<FileDescriptorSet>, prost::DecodeError> {
    let mut protocol = FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET)?;
    protocol.file.retain(|file| {
        let package = file.package.as_deref().unwrap_or_default();
        file.service.iter().all(|service| {
            let name = format!("{package}.{}", service.name.as_deref().unwrap_or_default());
            proto::SERVICES.contains(&name.as_str())
        })
    });
    Ok(vec![
        protocol,
        FileDescriptorSet::decode(tonic_types::pb::FILE_DESCRIPTOR_SET)?,
        FileDescriptorSet::decode(tonic_health::pb::FILE_DESCRIPTOR_SET)?,
    ])
}

/// A reflection builder over `descriptors` (from [`served_descriptors`]).
pub fn builder(descriptors: &[FileDescriptorSet]) -> tonic_reflection::server::Builder<'static> {
    descriptors.iter().cloned().fold(
        tonic_reflection::server::Builder::configure(),
        |builder, set| builder.register_file_descriptor_set(set),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn services(sets: &[FileDescriptorSet]) -> Vec<String> {
        sets.iter()
            .flat_map(|set| &set.file)
            .flat_map(|file| {
                let package = file.package.clone().unwrap_or_default();
                file.service
                    .iter()
                    .map(move |s| format!("{package}.{}", s.name.clone().unwrap_or_default()))
            })
            .collect()
    }

    #[test]
    fn only_served_services_and_the_error_details_are_described() {
        let sets = served_descriptors().unwrap();
        let listed = services(&sets);
        for served in proto::SERVICES {
            assert!(listed.contains(&(*served).to_owned()), "{served}");
        }
        assert!(!listed.iter().any(|s| s.ends_with("ProviderAdapter")));
        let messages: Vec<String> = sets
            .iter()
            .flat_map(|set| &set.file)
            .filter(|file| file.package.as_deref() == Some("google.rpc"))
            .flat_map(|file| file.message_type.iter().filter_map(|m| m.name.clone()))
            .collect();
        for detail in ["ErrorInfo", "RetryInfo", "BadRequest", "Status"] {
            assert!(messages.contains(&detail.to_owned()), "{detail}");
        }
    }
}
