//! The rules of the leases a journal granted, kept in memory for their holders' reports.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::lease::LeaseToken;
use crate::domain::model::{ActionType, OperationRecord, Status};
use crate::domain::policy::ActionPolicy;
use crate::store::Clock;

/// Most leases whose rules a [`Journal`] keeps in memory at once (see [`LeaseRules`]). An
/// entry holds the lease token, the action type and, only when it differs from the policy
/// file's entry, the recorded action policy: a few hundred bytes.
pub const LEASE_RULES_ENTRIES: u64 = 10_000;

/// What a holder's report needs from its operation's row besides the row's status: the action
/// type and the recorded action policy. Neither changes after registration (no statement
/// updates `action_type` or `action_policy`), so they can be kept from the Begin that granted
/// the lease.
#[derive(Debug)]
pub(super) struct LeaseRule {
    /// The lease it belongs to; a token must match it in full.
    token: LeaseToken,
    /// The operation's action type.
    pub(super) action_type: ActionType,
    /// The recorded policy when it is not the file's entry for `action_type`; `None` means
    /// that entry (the same rule as for a row without a readable recorded policy).
    pub(super) recorded: Option<ActionPolicy>,
    /// Time left on the lease when it was granted or last renewed.
    lives_for: Duration,
    /// When the lease ends, by the store's clock as this process reads it.
    ends: DateTime<Utc>,
}

/// The rules of the leases this journal granted, by lease id, so that Complete and
/// ReportUnknown need not read the row before their report. Bounded: at most the configured
/// number of entries, each removed at its holder's report or at the end of its lease
/// (renewals move the end), whichever comes first. A missing entry (granted by another
/// replica or before a restart, evicted, or past its lease) only means the row is read, as
/// it always was.
///
/// The end of a lease is measured as the database measured its length, and an entry is
/// answered only before it by the store's [`Clock`]: real time in production, moved forward
/// by tests (which then need not sleep for an entry to end). The cache also drops each entry
/// at that end by real time, to bound its memory.
#[derive(Clone)]
pub(super) struct LeaseRules {
    entries: moka::sync::Cache<Uuid, Arc<LeaseRule>>,
    clock: Clock,
}

/// Expires an entry when its lease ends.
struct AtLeaseEnd;

impl moka::Expiry<Uuid, Arc<LeaseRule>> for AtLeaseEnd {
    fn expire_after_create(
        &self,
        _lease_id: &Uuid,
        rule: &Arc<LeaseRule>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(rule.lives_for)
    }

    fn expire_after_update(
        &self,
        _lease_id: &Uuid,
        rule: &Arc<LeaseRule>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(rule.lives_for)
    }
}

impl LeaseRules {
    pub(super) fn new(max_entries: u64, clock: Clock) -> Self {
        Self {
            entries: moka::sync::Cache::builder()
                .max_capacity(max_entries)
                .expire_after(AtLeaseEnd)
                .build(),
            clock,
        }
    }

    /// Now, by the store's clock.
    fn now(&self) -> DateTime<Utc> {
        self.clock.now().unwrap_or_else(Utc::now)
    }

    /// Keeps the rules of the lease `token` just granted on `record`; `file` is the policy
    /// file's entry for its action type.
    pub(super) fn remember(
        &self,
        token: &LeaseToken,
        record: &OperationRecord,
        file: Option<&ActionPolicy>,
    ) {
        let Some(lives_for) = lease_left(record) else {
            return;
        };
        let recorded = record
            .action_policy
            .as_ref()
            .filter(|recorded| Some(*recorded) != file)
            .cloned();
        self.entries.insert(
            token.lease_id,
            Arc::new(LeaseRule {
                token: token.clone(),
                action_type: record.action_type.clone(),
                recorded,
                lives_for,
                ends: self.now() + lives_for,
            }),
        );
    }

    /// The rules kept for `token`'s lease, if any and the lease has not ended.
    pub(super) fn recall(&self, token: &LeaseToken) -> Option<Arc<LeaseRule>> {
        self.entries
            .get(&token.lease_id)
            .filter(|rule| rule.token == *token && self.now() < rule.ends)
    }

    /// Moves the end of a kept lease to the renewed `record`'s.
    pub(super) fn extend(&self, token: &LeaseToken, record: &OperationRecord) {
        let (Some(rule), Some(lives_for)) = (self.recall(token), lease_left(record)) else {
            return;
        };
        self.entries.insert(
            token.lease_id,
            Arc::new(LeaseRule {
                token: rule.token.clone(),
                action_type: rule.action_type.clone(),
                recorded: rule.recorded.clone(),
                lives_for,
                ends: self.now() + lives_for,
            }),
        );
    }

    /// Drops what was kept for `token`'s lease.
    pub(super) fn forget(&self, token: &LeaseToken) {
        self.entries.invalidate(&token.lease_id);
    }
}

/// Time left on `record`'s lease by the database clock; `None` when it has none left.
fn lease_left(record: &OperationRecord) -> Option<Duration> {
    let left = (record.lease_until? - record.observed_at).to_std().ok()?;
    (!left.is_zero()).then_some(left)
}

/// Where a report takes its rules from.
pub(super) enum ReportRules {
    /// Kept from the Begin that granted the lease; the row was not read.
    Kept(Arc<LeaseRule>),
    /// The row, read before the report.
    Read(Box<OperationRecord>),
}

impl ReportRules {
    /// The row's status when it was read first: the transition's "from".
    pub(super) fn status(&self) -> Option<Status> {
        match self {
            Self::Kept(_) => None,
            Self::Read(row) => Some(row.status),
        }
    }
}
