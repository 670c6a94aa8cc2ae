//! The lease holder's reports (complete, fail, unknown) and renewals.

use std::time::Duration;

use super::Journal;
use super::command::{Complete, Fail, Renew, ReportUnknown};
use super::lease_rules::ReportRules;
use crate::domain::error::JournalError;
use crate::domain::lease::{self, LeaseToken};
use crate::domain::model::{ErrorCode, OperationRecord, Status};
use crate::domain::policy::{ActionPolicy, AdapterConfig, ResultSource};
use crate::store::Settlement;

impl Journal {
    /// Records a confirmed success: -> `succeeded` (article, step 6).
    ///
    /// The command's `result_json` is any JSON value as text (empty = no result body); it is
    /// parsed within the request limits (`INVALID_RESULT`), then sanitized by
    /// the action's result rules (deny-list, `result.keep`, `result.max_bytes`; see
    /// [`crate::domain::result`]) and stored in its RFC 8785 canonical form. Errors:
    /// `ABORTED`/`LEASE_LOST`, `FAILED_PRECONDITION`/`OUTCOME_ALREADY_RECORDED`,
    /// `NOT_FOUND`/`OPERATION_NOT_FOUND`, `INVALID_ARGUMENT` (`RESULT_TOO_LARGE` when the
    /// sanitized result is over `result.max_bytes`).
    pub async fn complete(&self, command: Complete) -> Result<OperationRecord, JournalError> {
        let Complete {
            token,
            external_id,
            result_json,
        } = command;
        let value = self.limits.result("result_json", &result_json)?;
        let (result_json, before) = match value {
            None => (None, None),
            Some(value) => {
                let rules = self.report_rules(&token).await?;
                let sanitized = self
                    .policy
                    .result_rules(self.action_of(&rules), ResultSource::Caller)
                    .sanitize(value);
                match sanitized {
                    Ok(result_json) => (result_json, rules.status()),
                    Err(error) => {
                        if rules.status().is_none() {
                            // As when the row is read first: a missing operation is
                            // NOT_FOUND before its result is refused.
                            self.read_for_report(&token).await?;
                        }
                        return Err(error.into_error("result_json"));
                    }
                }
            }
        };
        self.settle(
            &token,
            before,
            Settlement::Succeeded {
                external_id,
                result_json,
            },
        )
        .await
    }

    /// The row a holder reports on, read before the report: its status is the transition's
    /// "from".
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`; `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    async fn read_for_report(&self, token: &LeaseToken) -> Result<OperationRecord, JournalError> {
        self.store
            .get(&token.namespace, &token.operation_key)
            .await?
            .ok_or(JournalError::NotFound)
    }

    /// The rules of the operation a holder reports on: kept from the Begin that granted the
    /// lease when this journal granted it and it has not ended, else read from the row.
    ///
    /// Errors: as [`Journal::read_for_report`].
    async fn report_rules(&self, token: &LeaseToken) -> Result<ReportRules, JournalError> {
        match self.leases.recall(token) {
            Some(kept) => Ok(ReportRules::Kept(kept)),
            None => Ok(ReportRules::Read(Box::new(
                self.read_for_report(token).await?,
            ))),
        }
    }

    /// The action policy a report applies: the one recorded with the operation, or the
    /// file's entry for its action type when none was recorded (or it does not parse).
    fn action_of<'a>(&'a self, rules: &'a ReportRules) -> Option<&'a ActionPolicy> {
        let (action_type, recorded) = match rules {
            ReportRules::Kept(kept) => (&kept.action_type, kept.recorded.as_ref()),
            ReportRules::Read(row) => (&row.action_type, row.action_policy.as_ref()),
        };
        recorded.or_else(|| self.policy.action(action_type))
    }

    /// Records a definitive rejection that proves no effect: -> `failed_final`.
    ///
    /// Errors: as [`Journal::complete`]; `error_code` is required.
    pub async fn fail(&self, command: Fail) -> Result<OperationRecord, JournalError> {
        let Fail { token, error_code } = command;
        self.settle(&token, None, Settlement::FailedFinal { error_code })
            .await
    }

    /// Records that the outcome is not known: -> `unknown`; the first reconcile lookup is
    /// scheduled after the action's `first_check_after_seconds`.
    ///
    /// Errors: as [`Journal::complete`].
    pub async fn report_unknown(
        &self,
        command: ReportUnknown,
    ) -> Result<OperationRecord, JournalError> {
        let token = command.token;
        let error_code = (command.error_code).or(Some(ErrorCode::internal("unknown_outcome")));
        let rules = self.report_rules(&token).await?;
        // An action without a lookup goes to review at once; others wait for the first check.
        // An operation recorded under a `kind: none` adapter has none, whatever today's file
        // says of that name.
        let first_check_after = self
            .action_of(&rules)
            .filter(|a| {
                a.reconcile.adapter_kind.is_none_or(|kind| kind.looks_up())
                    && matches!(
                        self.policy.adapter_for(a),
                        Some((_, AdapterConfig::Http(_) | AdapterConfig::Grpc(_)))
                    )
            })
            .map(|a| Duration::from_secs(u64::from(a.reconcile.first_check_after_seconds)))
            .unwrap_or_default();
        self.settle(
            &token,
            rules.status(),
            Settlement::Unknown {
                error_code,
                first_check_after,
            },
        )
        .await
    }

    /// Applies a holder's report, counting the transition and any conflict. `before` is the
    /// status of the row when the caller read it first; without it, the report's statement
    /// answers the status it changed.
    async fn settle(
        &self,
        token: &LeaseToken,
        before: Option<Status>,
        settlement: Settlement,
    ) -> Result<OperationRecord, JournalError> {
        let result = self.settle_unobserved(token, before, settlement).await;
        match &result {
            Ok((record, Some(from))) => {
                self.metrics.transitions(Some(*from), record.status, 1);
            }
            Ok((_, None)) => {}
            Err(error) => self.metrics.journal_error(error),
        }
        result.map(|(record, _)| record)
    }

    /// The record after the report, and the status this call changed it from (`None`: a
    /// retried report answered from the row).
    async fn settle_unobserved(
        &self,
        token: &LeaseToken,
        before: Option<Status>,
        settlement: Settlement,
    ) -> Result<(OperationRecord, Option<Status>), JournalError> {
        let applied = self.store.settle(token, &settlement).await?;
        let applied = applied.map(|settled| (settled.record, before.unwrap_or(settled.previous)));
        // Applied or not, this lease reports nothing more that needs its rules.
        self.leases.forget(token);
        if let Some((record, from)) = applied {
            return Ok((record, Some(from)));
        }
        // Refused by the report's fence (`fence_report.sql`, the one statement of who may
        // report): the row, read again, only says why.
        let row = self
            .store
            .get(&token.namespace, &token.operation_key)
            .await?
            .ok_or(JournalError::NotFound)?;
        if row.attempt_count != token.attempt || row.lease_id != Some(token.lease_id) {
            return Err(JournalError::LeaseLost);
        }
        if settlement.already_recorded_in(&row) {
            return Ok((row, None)); // a retried report after its commit
        }
        Err(JournalError::OutcomeAlreadyRecorded {
            status: row.status,
            recorded_by: row.last_actor_kind,
        })
    }

    /// Extends a live lease to `lease_seconds` from now (0 or less gets the minimum).
    ///
    /// Errors: `ABORTED`/`LEASE_LOST` when the lease ended or was taken over;
    /// `NOT_FOUND`/`OPERATION_NOT_FOUND`; `INVALID_ARGUMENT`/`INVALID_LEASE_TOKEN`.
    pub async fn renew(&self, command: Renew) -> Result<OperationRecord, JournalError> {
        let Renew {
            token,
            lease_seconds,
        } = command;
        let lease = lease::renewal_duration(lease_seconds, self.policy.defaults.max_lease_seconds);
        if let Some(record) = self.store.renew(&token, lease).await? {
            self.leases.extend(&token, &record);
            return Ok(record);
        }
        let error = match self
            .store
            .get(&token.namespace, &token.operation_key)
            .await?
        {
            None => JournalError::NotFound,
            Some(_) => JournalError::LeaseLost,
        };
        self.metrics.journal_error(&error);
        Err(error)
    }
}
