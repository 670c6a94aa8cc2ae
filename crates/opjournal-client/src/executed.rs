//! [`Executed`]: where an `execute` ended, for a program and, as JSON, for a model.

use std::time::Duration;

#[cfg(doc)]
use crate::JournalClient;
use crate::proto::{self, Operation};

/// Where an [`JournalClient::execute`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    /// Succeeded; the stored result is `operation.result_json`.
    Succeeded {
        /// The record.
        operation: Operation,
        /// Whether this is a replay of an earlier execution (no provider call now).
        replayed: bool,
    },
    /// Confirmed rejection; `operation.error_code` says why.
    FailedFinal {
        /// The record.
        operation: Operation,
        /// Whether this is a replay of an earlier execution.
        replayed: bool,
    },
    /// The outcome is unknown; do not retry until reconciliation settles it.
    VerificationRequired {
        /// The record, `unknown` (or `in_progress` with an ended lease).
        operation: Operation,
    },
    /// Another caller holds the lease; ask again after `retry_after`.
    InProgress {
        /// The record.
        operation: Operation,
        /// Until the current lease ends.
        retry_after: Duration,
    },
    /// Held by the duplicate-intent policy; nothing was registered or called.
    DuplicateIntentSuspected {
        /// The key the same request is registered under.
        duplicate_of_operation_key: String,
    },
}

impl Executed {
    pub(crate) fn from_terminal(operation: Operation, replayed: bool) -> Self {
        if operation.status == proto::OperationStatus::Succeeded as i32 {
            Self::Succeeded {
                operation,
                replayed,
            }
        } else {
            Self::FailedFinal {
                operation,
                replayed,
            }
        }
    }

    /// The outcome's name: `succeeded`, `failed_final`, `verification_required`,
    /// `in_progress` or `duplicate_intent_suspected`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::FailedFinal { .. } => "failed_final",
            Self::VerificationRequired { .. } => "verification_required",
            Self::InProgress { .. } => "in_progress",
            Self::DuplicateIntentSuspected { .. } => "duplicate_intent_suspected",
        }
    }

    /// The record, for every outcome but [`Executed::DuplicateIntentSuspected`].
    pub fn operation(&self) -> Option<&Operation> {
        match self {
            Self::Succeeded { operation, .. }
            | Self::FailedFinal { operation, .. }
            | Self::VerificationRequired { operation }
            | Self::InProgress { operation, .. } => Some(operation),
            Self::DuplicateIntentSuspected { .. } => None,
        }
    }

    /// The stored result of a success, parsed (`None` otherwise or when none was kept).
    pub fn result(&self) -> Option<serde_json::Value> {
        match self {
            Self::Succeeded { operation, .. } => operation
                .result_json
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok()),
            _ => None,
        }
    }

    /// The outcome as JSON a program or a model can read, e.g. as a tool's answer:
    /// `outcome`, `replayed`, `external_id`, `result`, `error_code`, `retry_after_ms`, and
    /// `advice`, one sentence on what to do next. Keys and payloads are left out.
    pub fn to_json(&self) -> serde_json::Value {
        let operation = self.operation();
        let mut fields = serde_json::Map::new();
        fields.insert("outcome".into(), self.outcome().into());
        if let Self::Succeeded { replayed, .. } | Self::FailedFinal { replayed, .. } = self {
            fields.insert("replayed".into(), (*replayed).into());
        }
        if let Some(external_id) = operation.and_then(|op| op.external_id.clone()) {
            fields.insert("external_id".into(), external_id.into());
        }
        if let Some(result) = self.result() {
            fields.insert("result".into(), result);
        }
        if let Some(error_code) = operation.and_then(|op| op.error_code.clone()) {
            fields.insert("error_code".into(), error_code.into());
        }
        if let Self::InProgress { retry_after, .. } = self {
            let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
            fields.insert("retry_after_ms".into(), millis.into());
        }
        fields.insert("advice".into(), self.advice().into());
        fields.into()
    }

    fn advice(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "done; do not repeat this action",
            Self::FailedFinal { .. } => {
                "the provider refused; nothing happened; a new attempt needs a new intent"
            }
            Self::VerificationRequired { .. } => {
                "the outcome is not known yet; do not repeat; it is being verified with the provider"
            }
            Self::InProgress { .. } => {
                "another worker is performing this action; ask again later; do not repeat it"
            }
            Self::DuplicateIntentSuspected { .. } => {
                "the same request is already registered under another key; nothing was done"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_view_says_what_to_do_and_leaves_the_key_out() {
        let executed = Executed::Succeeded {
            operation: Operation {
                operation_key: "payment:order-817".into(),
                external_id: Some("pay_1".into()),
                result_json: Some(r#"{"id":"pay_1"}"#.into()),
                ..Operation::default()
            },
            replayed: true,
        };
        let json = executed.to_json();
        assert_eq!(json["outcome"], "succeeded");
        assert_eq!(json["replayed"], true);
        assert_eq!(json["result"]["id"], "pay_1");
        assert!(!json.to_string().contains("order-817"));
    }
}
