//! The server around the journal: health entries, reflection, reads and pagination.

use crate::common;

use common::*;
use opjournal::proto::{GetOperationRequest, ListOperationsRequest, OperationStatus};
use sqlx::PgPool;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn liveness_readiness_and_every_service_report_serving(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    // Readiness follows the first database check.
    let mut ready = false;
    for _ in 0..50 {
        let r = health
            .check(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await
            .unwrap()
            .into_inner();
        if r.status == ServingStatus::Serving as i32 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "readiness never became SERVING");
    for service in [
        "",
        "liveness",
        "opjournal.v1.OperationJournal",
        "opjournal.v1.Reconciler",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn unknown_operations_are_not_found_with_a_reason(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let err = app
        .journal
        .clone()
        .get_operation(GetOperationRequest {
            namespace: String::new(),
            operation_key: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "OPERATION_NOT_FOUND")
    );
    let err = app.reconcile("", "nope").await.unwrap_err();
    assert_eq!(reason(&err), "OPERATION_NOT_FOUND");
    // A live lease is not reconcilable.
    app.begin("live", "create_payment", "{}").await.unwrap();
    let err = app.reconcile("", "live").await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "OPERATION_NOT_RECONCILABLE")
    );
    assert_eq!(app.counts("live").lookups, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn list_operations_pages_through_a_namespace_with_filters(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for i in 0..7 {
        app.begin(&format!("k-{i}"), "create_payment", "{}")
            .await
            .unwrap();
    }
    app.begin_in("other", "k-x", "create_payment", "{}", 0)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .journal
            .clone()
            .list_operations(ListOperationsRequest {
                status: OperationStatus::InProgress as i32,
                action_type: "create_payment".into(),
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.operations.len() <= 3);
        seen.extend(page.operations.into_iter().map(|o| o.operation_key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    seen.sort();
    assert_eq!(seen, (0..7).map(|i| format!("k-{i}")).collect::<Vec<_>>());
    // A token is bound to its filters.
    let first = app
        .journal
        .clone()
        .list_operations(ListOperationsRequest {
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let err = app
        .journal
        .clone()
        .list_operations(ListOperationsRequest {
            status: OperationStatus::Succeeded as i32,
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn reflection_v1_and_v1alpha_list_every_service(pool: PgPool) {
    use tonic_reflection::pb::{v1, v1alpha};
    let app = TestApp::spawn(pool).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let expected = [
        "grpc.health.v1.Health",
        "opjournal.v1.OperationJournal",
        "opjournal.v1.Reconciler",
    ];

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        response.message_response
    else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for service in expected {
        assert!(
            names.iter().any(|n| n == service),
            "v1 lacks {service}: {names:?}"
        );
    }

    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        response.message_response,
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(_))
    ));
}
