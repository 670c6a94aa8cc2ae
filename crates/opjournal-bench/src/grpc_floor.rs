//! `opjournal-grpc-floor`: what a gRPC call costs by itself on this machine.
//!
//! A tonic server of the journal's own protocol (`opjournal.v1.OperationJournal`) that
//! answers `BeginOperation` and `CompleteOperation` from memory: a Begin of a new key is
//! answered EXECUTE with a fresh lease token and the operation in progress, a Begin of a key
//! already seen REPLAY, a Complete with the operation succeeded; every other call is
//! `UNIMPLEMENTED`. It runs on a multi-threaded Tokio runtime with tonic's defaults, like the
//! real server, but with no tracing, no authentication, no limits and no database: the
//! server's CPU per lifecycle measured against this one's is the share of the journal's own
//! work. `opjournal-bench` starts it beside the real server (see docs/performance.md, "The
//! gRPC floor").
//!
//! Prints `opjournal-grpc-floor listening on <address>` once it listens; stops on SIGTERM or
//! SIGINT.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash as _, Hasher as _};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use clap::Parser;
use opjournal::proto;
use opjournal::proto::operation_journal_server::{OperationJournal, OperationJournalServer};
use tonic::{Request, Response, Status};

/// Serves the journal's gRPC protocol from memory, as the floor of what a call costs.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// Shards of the key map: enough that clients on different keys rarely wait on each other.
const SHARDS: usize = 16;

/// What the floor remembers of an operation.
struct State {
    action_type: String,
    status: proto::OperationStatus,
    lease_token: String,
}

/// Operations by (namespace, key), in shards.
struct Floor {
    shards: Vec<Mutex<HashMap<(String, String), State>>>,
    tokens: AtomicU64,
}

impl Floor {
    fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            tokens: AtomicU64::new(0),
        }
    }

    /// The shard that holds `key` of `namespace`.
    fn shard(&self, namespace: &str, key: &str) -> &Mutex<HashMap<(String, String), State>> {
        let mut hasher = DefaultHasher::new();
        namespace.hash(&mut hasher);
        key.hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % SHARDS as u64).unwrap_or(0);
        &self.shards[index]
    }

    /// A fresh lease token that names its operation: a number, the namespace's length, the
    /// namespace and the key.
    fn token(&self, namespace: &str, key: &str) -> String {
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        format!("floor{n}.{}.{namespace}{key}", namespace.len())
    }
}

/// The (namespace, key) a lease token of [`Floor::token`] names.
fn parse_token(token: &str) -> Option<(String, String)> {
    let rest = token.strip_prefix("floor")?;
    let (_, rest) = rest.split_once('.')?;
    let (length, rest) = rest.split_once('.')?;
    let length: usize = length.parse().ok()?;
    let namespace = rest.get(..length)?;
    let key = rest.get(length..)?;
    Some((namespace.to_owned(), key.to_owned()))
}

/// The operation message of a floor answer: the fields the real server's minimal answer
/// carries.
fn operation(namespace: &str, key: &str, state: &State) -> proto::Operation {
    proto::Operation {
        namespace: namespace.to_owned(),
        operation_key: key.to_owned(),
        action_type: state.action_type.clone(),
        status: state.status.into(),
        attempt_count: 1,
        ..proto::Operation::default()
    }
}

/// The `OperationJournal` service of the floor.
struct FloorService(Floor);

impl FloorService {
    /// Begin: EXECUTE for a new key, REPLAY for one already seen.
    fn begin(
        &self,
        r: proto::BeginOperationRequest,
    ) -> Result<proto::BeginOperationResponse, Status> {
        let mut shard = self
            .0
            .shard(&r.namespace, &r.operation_key)
            .lock()
            .map_err(|_| Status::internal("poisoned"))?;
        let id = (r.namespace, r.operation_key);
        if let Some(state) = shard.get(&id) {
            return Ok(proto::BeginOperationResponse {
                decision: proto::Decision::Replay.into(),
                operation: Some(operation(&id.0, &id.1, state)),
                ..proto::BeginOperationResponse::default()
            });
        }
        let state = State {
            action_type: r.action_type,
            status: proto::OperationStatus::InProgress,
            lease_token: self.0.token(&id.0, &id.1),
        };
        let response = proto::BeginOperationResponse {
            decision: proto::Decision::Execute.into(),
            operation: Some(operation(&id.0, &id.1, &state)),
            lease_token: state.lease_token.clone(),
            ..proto::BeginOperationResponse::default()
        };
        shard.insert(id, state);
        Ok(response)
    }

    /// Complete: the operation of the lease token, succeeded.
    fn complete(
        &self,
        r: proto::CompleteOperationRequest,
    ) -> Result<proto::CompleteOperationResponse, Status> {
        let (namespace, key) =
            parse_token(&r.lease_token).ok_or_else(|| Status::invalid_argument("lease token"))?;
        let mut shard = self
            .0
            .shard(&namespace, &key)
            .lock()
            .map_err(|_| Status::internal("poisoned"))?;
        let state = shard
            .get_mut(&(namespace.clone(), key.clone()))
            .filter(|state| state.lease_token == r.lease_token)
            .ok_or_else(|| Status::failed_precondition("lease not held"))?;
        state.status = proto::OperationStatus::Succeeded;
        let mut operation = operation(&namespace, &key, state);
        operation.external_id = Some(r.external_id);
        operation.result_json = Some(r.result_json);
        Ok(proto::CompleteOperationResponse {
            operation: Some(operation),
        })
    }
}

/// The floor's `OperationJournal`: Begin and Complete from memory; every other RPC of the
/// service, listed with its request and response, answered `UNIMPLEMENTED`.
macro_rules! floor_service {
    ($($rpc:ident($request:ident) -> $response:ident;)*) => {
        #[tonic::async_trait]
        impl OperationJournal for FloorService {
            async fn begin_operation(
                &self,
                request: Request<proto::BeginOperationRequest>,
            ) -> Result<Response<proto::BeginOperationResponse>, Status> {
                self.begin(request.into_inner()).map(Response::new)
            }

            async fn complete_operation(
                &self,
                request: Request<proto::CompleteOperationRequest>,
            ) -> Result<Response<proto::CompleteOperationResponse>, Status> {
                self.complete(request.into_inner()).map(Response::new)
            }

            $(async fn $rpc(
                &self,
                _: Request<proto::$request>,
            ) -> Result<Response<proto::$response>, Status> {
                Err(Status::unimplemented("not served by the gRPC floor"))
            })*
        }
    };
}

floor_service! {
    fail_operation(FailOperationRequest) -> FailOperationResponse;
    report_unknown_outcome(ReportUnknownOutcomeRequest) -> ReportUnknownOutcomeResponse;
    renew_lease(RenewLeaseRequest) -> RenewLeaseResponse;
    get_operation(GetOperationRequest) -> GetOperationResponse;
    list_operations(ListOperationsRequest) -> ListOperationsResponse;
    derive_operation_key(DeriveOperationKeyRequest) -> DeriveOperationKeyResponse;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "opjournal-grpc-floor listening on {address}")?;
        out.flush()?;
    }
    // As tonic's own `serve` does, and the real server: no Nagle delay on answers.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(OperationJournalServer::new(FloorService(Floor::new())))
        .serve_with_incoming_shutdown(incoming, async {
            opjournal_signal::stop_signal().await;
        })
        .await
        .context("the gRPC floor failed")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_lease_token_names_its_operation() {
        let floor = Floor::new();
        let token = floor.token("tenant.a", "bench:r1:l:c0n7");
        assert_eq!(
            parse_token(&token),
            Some(("tenant.a".to_owned(), "bench:r1:l:c0n7".to_owned()))
        );
        let empty = floor.token("", "k");
        assert_ne!(token, empty, "every token is fresh");
        assert_eq!(parse_token(&empty), Some((String::new(), "k".to_owned())));
        assert_eq!(parse_token("floor1.9.short"), None);
        assert_eq!(parse_token("other"), None);
    }
}
