//! Reads: one operation, search, the operations list; and key derivation.

use super::command::{DeriveKey, ListOperations, OperationRef};
use super::limits::parse_references;
use super::{Journal, PageToken};
use crate::domain::error::{ErrorReason, FieldViolation, JournalError};
use crate::domain::model::{
    ActionType, ExternalId, Namespace, OperationKey, OperationRecord, Status,
};
use crate::store::{ListQuery, SearchQuery};

/// What [`Journal::search`] looks an operation up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchTerm {
    /// The idempotency key.
    OperationKey(String),
    /// The provider's id of the effect.
    ExternalId(String),
    /// A business reference, `name` = `value` (e.g. `order_id` = `817`).
    Reference {
        /// The reference's name.
        name: String,
        /// Its value.
        value: String,
    },
}

impl Journal {
    /// The opaque, stable key for an intent (see [`crate::domain::derived_key`]): the same
    /// namespace, action type and intent reference always give the same key under the same
    /// server secret. Nothing is stored; the intent reference is neither kept nor logged.
    ///
    /// Errors: `FAILED_PRECONDITION`/`KEY_DERIVATION_DISABLED` without a configured secret;
    /// `INVALID_ARGUMENT`/`ACTION_TYPE_NOT_CONFIGURED`; `INVALID_ARGUMENT` for an empty or
    /// too long intent reference.
    pub fn derive_key(&self, command: &DeriveKey) -> Result<OperationKey, JournalError> {
        let deriver = self
            .key_deriver
            .as_ref()
            .ok_or(JournalError::KeyDerivationDisabled)?;
        if self.policy.action(&command.action_type).is_none() {
            return Err(JournalError::ActionTypeNotConfigured);
        }
        deriver.derive(
            &command.namespace,
            &command.action_type,
            &command.intent_reference,
        )
    }

    /// Reads one operation. Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`.
    pub async fn get(&self, operation: &OperationRef) -> Result<OperationRecord, JournalError> {
        self.store
            .get(&operation.namespace, &operation.operation_key)
            .await?
            .ok_or(JournalError::NotFound)
    }

    /// Finds a namespace's operations by `term`, newest first, at most a page of them
    /// (`page_size` as in [`Journal::list`]). A key finds its one operation.
    ///
    /// Errors: `INVALID_ARGUMENT` for a malformed namespace, key, external id or reference
    /// name, or an empty term (`INVALID_FIELD_LENGTH`); `INVALID_PAGE_SIZE`.
    pub async fn search(
        &self,
        namespace: &str,
        term: &SearchTerm,
        page_size: i32,
    ) -> Result<Vec<OperationRecord>, JournalError> {
        let namespace = Namespace::parse(namespace)?;
        let limit = self.limits.page_limit(page_size)?;
        let required = |field: &'static str| {
            JournalError::invalid(
                ErrorReason::InvalidFieldLength,
                FieldViolation::new(field, "is required"),
            )
        };
        let (external_id, reference) = match term {
            SearchTerm::OperationKey(key) => {
                let key = OperationKey::parse(key)?;
                let found = self.store.get(&namespace, &key).await?;
                return Ok(found.into_iter().collect());
            }
            SearchTerm::ExternalId(id) => {
                let id = ExternalId::parse_optional(id)?.ok_or_else(|| required("external_id"))?;
                (Some(id.as_str().to_owned()), None)
            }
            SearchTerm::Reference { name, value } => {
                if name.is_empty() {
                    return Err(required("references"));
                }
                let reference = parse_references([(name.clone(), value.clone())], 1)?;
                (None, reference.into_iter().next())
            }
        };
        let query = SearchQuery {
            namespace,
            external_id,
            reference,
            limit,
        };
        Ok(self.store.search(&query).await?)
    }

    /// Lists operations newest first; returns the page and the next page token (empty at the
    /// end). Page size 0 means 50; the largest page is `max_page_size` (500 by default).
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_TOKEN` for a token from other filters,
    /// `INVALID_PAGE_SIZE` for a negative size.
    pub async fn list(
        &self,
        command: ListOperations,
    ) -> Result<(Vec<OperationRecord>, String), JournalError> {
        let ListOperations {
            namespace,
            status,
            action_type,
            page,
        } = command;
        let limit = self.limits.page_limit(page.size)?;
        let filters = format!(
            "{}|{}|{}",
            namespace,
            status.map(Status::as_str).unwrap_or(""),
            action_type.as_ref().map(ActionType::as_str).unwrap_or("")
        );
        let after = if page.token.is_empty() {
            None
        } else {
            Some(PageToken::decode(&page.token, &filters)?)
        };
        let mut rows = self
            .store
            .list(&ListQuery {
                namespace,
                status,
                action_type,
                after,
                limit: limit + 1,
            })
            .await?;
        let next = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last()
                .map(|last| {
                    PageToken::encode(last.created_at, last.operation_key.as_str(), &filters)
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((rows, next))
    }
}
