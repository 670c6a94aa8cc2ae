//! The operator commands (`opjournal list|show|review|reconcile|resolve`): gRPC clients of a
//! running server, for people (aligned text) and for scripts (`--json`, one document on
//! stdout).
//!
//! They read and settle operations only through the public API, so they see exactly what an
//! orchestrator would and every rule (compare-and-set on the attempt a reviewer saw, terminal
//! states never change) is enforced by the server, not here. Nothing printed can carry a
//! payload (the journal keeps only its hash) or a lease token (no read returns one).

pub mod args;
pub mod client;
pub mod error;
pub mod format;
pub mod rows;

use std::io::Write as _;
use std::process::ExitCode;

use opjournal_client::{ClientError, JournalClient, ListFilter};
use serde::Serialize;

use crate::api::convert::status_to_proto;
pub use args::OpsCommand;
pub use client::{ClientOptions, connect};
pub use error::ErrorReport;
use rows::{EventRow, OperationDetail, OperationRow, ReconcileRow};

/// The result of a command, before it is printed.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// `list`: operations, newest first.
    Operations(Vec<OperationRow>),
    /// `review`: operations waiting for review, oldest escalation first.
    Review(Vec<OperationRow>),
    /// `show`: the record with its result, and its history, oldest first.
    Show {
        /// The record.
        operation: OperationDetail,
        /// Its history.
        history: Vec<EventRow>,
    },
    /// `reconcile`: the observation, the action, the record after.
    Reconcile(ReconcileRow),
    /// `resolve`: the record after the decision.
    Resolved(OperationRow),
}

impl Output {
    /// The text for people.
    pub fn text(&self) -> String {
        match self {
            Self::Operations(rows) => format::operations_table(rows),
            Self::Review(rows) => format::review_table(rows),
            Self::Show { operation, history } => format::show(operation, history),
            Self::Reconcile(row) => format::reconcile(row),
            Self::Resolved(row) => format::operation(row),
        }
    }

    /// The JSON document for scripts, fields in declaration order: an array for `list` and
    /// `review`, an object otherwise (`show`: `{"operation", "history"}`; `reconcile`:
    /// `{"operation", "observation", "action"}`; `resolve`: the operation).
    pub fn json(&self) -> serde_json::Result<String> {
        match self {
            Self::Operations(rows) | Self::Review(rows) => serde_json::to_string_pretty(rows),
            Self::Show { operation, history } => {
                serde_json::to_string_pretty(&ShowDocument { operation, history })
            }
            Self::Reconcile(row) => serde_json::to_string_pretty(row),
            Self::Resolved(row) => serde_json::to_string_pretty(row),
        }
    }
}

#[derive(Serialize)]
struct ShowDocument<'a> {
    operation: &'a OperationDetail,
    history: &'a [EventRow],
}

/// Calls the server for `command` and returns what to print.
///
/// Errors: the server's status, decoded; `UNAVAILABLE` when it cannot be reached;
/// `INTERNAL`/`MALFORMED_RESPONSE` when its response lacks a field the contract promises.
pub async fn execute(client: &JournalClient, command: &OpsCommand) -> Result<Output, ClientError> {
    let namespace = command.common().namespace.as_str();
    Ok(match command {
        OpsCommand::List(a) => {
            let filter = ListFilter {
                namespace: namespace.to_owned(),
                status: a.status.map(|s| status_to_proto(s.into())),
                action_type: a.action_type.clone().unwrap_or_default(),
            };
            let operations = client.list_operations(&filter, a.limit).await?;
            Output::Operations(operations.iter().map(OperationRow::from).collect())
        }
        OpsCommand::Show(a) => {
            let operation = client.get(namespace, &a.key).await?;
            let history = client.history(namespace, &a.key).await?;
            Output::Show {
                operation: OperationDetail::from(&operation),
                history: history.iter().map(EventRow::from).collect(),
            }
        }
        OpsCommand::Review(a) => {
            let operations = client.review_queue(namespace, a.limit).await?;
            Output::Review(operations.iter().map(OperationRow::from).collect())
        }
        OpsCommand::Reconcile(a) => {
            let reconciled = client.reconcile(namespace, &a.key).await?;
            Output::Reconcile(ReconcileRow::try_from(&reconciled)?)
        }
        OpsCommand::Resolve(a) => {
            let operation = client.resolve(a.request()?).await?;
            Output::Resolved(OperationRow::from(&operation))
        }
    })
}

/// Runs `command` against `--server` (with its TLS files and token) and prints the result
/// on stdout (text, or one JSON document with `--json`). A failure is printed on stderr as
/// `error: <CODE> <REASON>: <message>` (and, with `--json`, as `{"error": {...}}` on
/// stdout). Returns the exit code: 0, [`error::EXIT_REFUSED`] or [`error::EXIT_FAILED`].
pub async fn run(command: OpsCommand) -> ExitCode {
    let common = command.common();
    let json = common.json;
    let result = match connect(common.server.clone(), &common.client_options()) {
        Ok(client) => execute(&client, &command).await,
        Err(error) => Err(error),
    };
    let (document, code) = match result {
        Ok(output) if json => (output.json().map(line), ExitCode::SUCCESS),
        Ok(output) => {
            let mut text = output.text();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            (Ok(text), ExitCode::SUCCESS)
        }
        Err(error) => {
            let report = ErrorReport::from_error(&error);
            eprintln!("{}", report.line());
            let document = if json {
                report.json().map(line)
            } else {
                Ok(String::new())
            };
            (document, report.exit_code())
        }
    };
    let written = document.map_err(std::io::Error::from).and_then(|document| {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(document.as_bytes())?;
        stdout.flush()
    });
    match written {
        Ok(()) => code,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            ExitCode::from(error::EXIT_FAILED)
        }
    }
}

fn line(mut text: String) -> String {
    text.push('\n');
    text
}
