//! A failed call as the operator sees it: the gRPC code, the `ErrorInfo` reason, the message,
//! and the exit code scripts branch on.

use std::process::ExitCode;

use opjournal_client::{ClientError, ErrorReason};
use serde::Serialize;
use tonic::Code;

/// Exit code of a call the server refused because of the request, the operation's state or
/// the caller's credentials (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
/// `FAILED_PRECONDITION`, `ABORTED`, `UNAUTHENTICATED`, `PERMISSION_DENIED`); clap's usage
/// errors use it too. Repeating the same command will not help.
pub const EXIT_REFUSED: u8 = 2;
/// Exit code of every other failure (server unreachable, unavailable, internal error).
pub const EXIT_FAILED: u8 = 1;

/// One failed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorReport {
    /// The gRPC code; written in UPPER_SNAKE (`NOT_FOUND`).
    #[serde(serialize_with = "serialize_code")]
    pub code: Code,
    /// The `google.rpc.ErrorInfo` reason (`OPERATION_NOT_FOUND`); `None` when the status
    /// carries none (e.g. the server could not be reached).
    pub reason: Option<String>,
    /// The message, for people; scripts match on `code` and `reason`.
    pub message: String,
}

impl ErrorReport {
    /// The report of a failed call; a failure without an `ErrorInfo` (the server could not
    /// be reached, the call ran out of time) has no reason.
    pub fn from_error(error: &ClientError) -> Self {
        Self {
            code: error.code,
            reason: match &error.reason {
                ErrorReason::Transport => None,
                reason => Some(reason.as_str().to_owned()),
            },
            message: error.message.clone(),
        }
    }

    /// The report of a status (decoded as [`ClientError`]).
    pub fn from_status(status: &tonic::Status) -> Self {
        Self::from_error(&ClientError::from(status.clone()))
    }

    /// The stderr line: `error: <CODE> <REASON>: <message>`.
    pub fn line(&self) -> String {
        format!(
            "error: {} {}: {}",
            code_name(self.code),
            self.reason.as_deref().unwrap_or(super::format::EMPTY),
            self.message
        )
    }

    /// The `--json` document: `{"error": {"code", "reason", "message"}}`.
    pub fn json(&self) -> serde_json::Result<String> {
        #[derive(Serialize)]
        struct Document<'a> {
            error: &'a ErrorReport,
        }
        serde_json::to_string_pretty(&Document { error: self })
    }

    /// The process exit code for this failure.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(exit_status(self.code))
    }
}

/// `EXIT_REFUSED` for the codes that describe the request, the operation's state or the
/// credentials, `EXIT_FAILED` otherwise.
pub fn exit_status(code: Code) -> u8 {
    match code {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::Unauthenticated
        | Code::PermissionDenied => EXIT_REFUSED,
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => EXIT_FAILED,
    }
}

pub use crate::telemetry::grpc::code_name;

fn serialize_code<S: serde::Serializer>(code: &Code, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(code_name(*code))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;
    use crate::api::status::status;

    #[test]
    fn a_refusal_names_code_and_reason_and_exits_two() {
        let report = ErrorReport::from_status(&status(
            Code::FailedPrecondition,
            "OPERATION_CHANGED",
            "changed",
            HashMap::new(),
        ));
        assert_eq!(
            report.line(),
            "error: FAILED_PRECONDITION OPERATION_CHANGED: changed"
        );
        assert_eq!(exit_status(report.code), EXIT_REFUSED);
        let json: serde_json::Value = serde_json::from_str(&report.json().unwrap()).unwrap();
        assert_eq!(json["error"]["code"], "FAILED_PRECONDITION");
        assert_eq!(json["error"]["reason"], "OPERATION_CHANGED");
    }

    #[test]
    fn an_unreachable_server_has_no_reason_and_exits_one() {
        let report = ErrorReport::from_status(&tonic::Status::unavailable("connection refused"));
        assert_eq!(report.line(), "error: UNAVAILABLE -: connection refused");
        assert_eq!(exit_status(report.code), EXIT_FAILED);
        let json: serde_json::Value = serde_json::from_str(&report.json().unwrap()).unwrap();
        assert_eq!(json["error"]["reason"], serde_json::Value::Null);
    }
}
