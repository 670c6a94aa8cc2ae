//! The contract a service mesh and generic gRPC tools rely on: every RPC declares its
//! `idempotency_level`, the shipped service config retries only what is safe and every
//! client carries the same one, and reflection describes the error details and only the
//! services this server serves.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use prost::Message as _;
use prost_types::method_options::IdempotencyLevel;
use sqlx::PgPool;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every RPC of every service in the protocol, as `Service/Method`, with its declared level.
fn declared_levels() -> BTreeMap<String, Option<IdempotencyLevel>> {
    let set =
        prost_types::FileDescriptorSet::decode(opjournal::proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut levels = BTreeMap::new();
    for file in set.file.iter().filter(|f| f.package() == "opjournal.v1") {
        for service in &file.service {
            for method in &service.method {
                let level = method
                    .options
                    .as_ref()
                    .and_then(|o| o.idempotency_level)
                    .map(|l| IdempotencyLevel::try_from(l).unwrap());
                levels.insert(format!("{}/{}", service.name(), method.name()), level);
            }
        }
    }
    levels
}

#[test]
fn every_rpc_declares_its_idempotency_level_reads_having_no_side_effects() {
    let levels = declared_levels();
    assert_eq!(levels.len(), 13, "{levels:?}");
    for (rpc, level) in &levels {
        let method = rpc.split('/').nth(1).unwrap();
        let read = ["Get", "List", "Derive", "Lookup"]
            .iter()
            .any(|verb| method.starts_with(verb));
        let expected = if read {
            IdempotencyLevel::NoSideEffects
        } else {
            IdempotencyLevel::Idempotent
        };
        assert_eq!(*level, Some(expected), "{rpc}");
    }
}

fn service_config() -> serde_json::Value {
    let text =
        std::fs::read_to_string(format!("{ROOT}/proto/opjournal/v1/service_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_service_config_retries_only_unavailable_and_only_repeatable_rpcs() {
    let config = service_config();
    let levels = declared_levels();
    let methods = config["methodConfig"].as_array().unwrap();
    let mut retried = Vec::new();
    for method in methods {
        let policy = &method["retryPolicy"];
        assert_eq!(
            policy["retryableStatusCodes"],
            serde_json::json!(["UNAVAILABLE"])
        );
        assert!(policy["maxAttempts"].as_u64().unwrap() <= 5);
        for name in method["name"].as_array().unwrap() {
            let service = name["service"].as_str().unwrap();
            let rpc = format!(
                "{}/{}",
                service.strip_prefix("opjournal.v1.").unwrap(),
                name["method"].as_str().unwrap()
            );
            assert!(levels[&rpc].is_some(), "{rpc} is not repeatable");
            retried.push(rpc);
        }
    }
    for rpc in [
        "OperationJournal/BeginOperation",
        "OperationJournal/CompleteOperation",
        "OperationJournal/FailOperation",
        "OperationJournal/ReportUnknownOutcome",
        "OperationJournal/GetOperation",
    ] {
        assert!(retried.iter().any(|r| r == rpc), "{rpc} is not retried");
    }
    // A person's decision and an operator's lookup answer differently when repeated after
    // the first took effect; the operator repeats them knowingly.
    for rpc in [
        "Reconciler/ResolveOperation",
        "Reconciler/ReconcileOperation",
    ] {
        assert!(!retried.iter().any(|r| r == rpc), "{rpc} is retried");
    }
}

#[test]
fn every_client_ships_the_same_service_config() {
    let expected = service_config();
    for path in [
        "clients/python/src/opjournal_client/service_config.json",
        "clients/go/service_config.json",
    ] {
        let text = std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap();
        let copy: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            copy, expected,
            "{path}: copy proto/opjournal/v1/service_config.json"
        );
    }
    let ts = std::fs::read_to_string(format!("{ROOT}/clients/typescript/src/service-config.ts"))
        .unwrap();
    let start = ts.find("SERVICE_CONFIG: ServiceConfig = {").unwrap();
    let object = &ts[start..];
    let object = &object[object.find('{').unwrap()..=object.find("\n};").unwrap() + 1];
    let copy: serde_json::Value = serde_json::from_str(object).unwrap();
    assert_eq!(copy, expected, "service-config.ts");
}

async fn reflect(app: &TestApp, request: MessageRequest) -> Result<MessageResponse, tonic::Status> {
    let mut client = ServerReflectionClient::new(app.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer: ServerReflectionResponse = answers.message().await?.unwrap();
    Ok(answer.message_response.unwrap())
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn reflection_resolves_the_error_details_and_lists_only_served_services(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let MessageResponse::ListServicesResponse(list) =
        reflect(&app, MessageRequest::ListServices(String::new()))
            .await
            .unwrap()
    else {
        panic!("not a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for served in opjournal::proto::SERVICES {
        assert!(names.iter().any(|n| n == served), "{served} in {names:?}");
    }
    assert!(
        names.iter().any(|n| n == "grpc.health.v1.Health"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.contains("ProviderAdapter")),
        "{names:?}"
    );

    for detail in [
        "google.rpc.ErrorInfo",
        "google.rpc.RetryInfo",
        "google.rpc.BadRequest",
    ] {
        let answer = reflect(&app, MessageRequest::FileContainingSymbol(detail.into()))
            .await
            .unwrap();
        let MessageResponse::FileDescriptorResponse(files) = answer else {
            panic!("{detail}: {answer:?}");
        };
        let file =
            prost_types::FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice())
                .unwrap();
        assert_eq!(file.package(), "google.rpc", "{detail}");
    }
    let refused = reflect(
        &app,
        MessageRequest::FileContainingSymbol("opjournal.v1.ProviderAdapter".into()),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
}
