//! The invariants, checked key by key once the run has settled: the journal's rows against
//! the provider's effects (the sandbox's ledger), and against every report the journal
//! acknowledged to an agent or to the reviewer.

use std::collections::{BTreeMap, HashMap};

use opjournal_client::Operation;
use opjournal_client::proto::{ActorKind, OperationEvent, OperationStatus};
use serde::{Deserialize, Serialize};

use crate::agent::Ack;
use crate::plan::Plan;

/// One key of the sandbox's ledger (`GET /v1/admin/ledger`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct LedgerKey {
    /// The provider key.
    pub key: String,
    /// POSTs that carried it.
    pub requests: u64,
    /// Effects stored under it.
    pub effects: u64,
    /// POSTs answered with an earlier effect (the provider's own deduplication).
    pub replays: u64,
    /// The ids of its effects, oldest first.
    pub effect_ids: Vec<String>,
}

/// Everything the check reads.
pub struct Facts<'a> {
    /// The intents of the run.
    pub plans: &'a [Plan],
    /// Acknowledged reports per key (agents and reviewer).
    pub acks: HashMap<String, Vec<Ack>>,
    /// The journal's rows per key.
    pub rows: HashMap<String, Operation>,
    /// The history of the keys whose acknowledged reports need it.
    pub histories: HashMap<String, Vec<OperationEvent>>,
    /// The provider's ledger per key.
    pub ledger: HashMap<String, LedgerKey>,
    /// Status codes answered by the servers, per RPC, and the errors agents saw.
    pub server_codes: BTreeMap<String, BTreeMap<String, u64>>,
    /// Agents' errors and odd outcomes, as `CODE/REASON` (or an outcome name), per key.
    pub agent_errors: HashMap<String, Vec<String>>,
}

/// One invariant's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Invariant {
    /// What must hold.
    pub rule: &'static str,
    /// How many keys (or answers) break it.
    pub broken: u64,
    /// Up to ten of them, each with what was found.
    pub examples: Vec<String>,
}

/// The verdict and the counts the report shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Every invariant, in a fixed order.
    pub invariants: Vec<Invariant>,
    /// Final statuses (`succeeded`, `failed_final`, `unknown`, `pending`, `in_progress`,
    /// and `not_registered` for a key the journal never held).
    pub statuses: BTreeMap<String, u64>,
    /// Unknown operations still waiting in the review queue.
    pub in_review: u64,
    /// Unknown operations not (yet) escalated.
    pub unknown_not_in_review: u64,
    /// Effects the provider stored.
    pub effects: u64,
    /// Repeat calls the provider deduplicated (payments only).
    pub provider_replays: u64,
    /// Acknowledged reports checked.
    pub acks_checked: u64,
    /// Keys a reconcile lookup was made for (their outcome was unknown at some point).
    pub looked_up: u64,
    /// Keys granted more than one lease (executed again after a release, or a lease that
    /// ended unreported).
    pub leased_more_than_once: u64,
}

impl Verdict {
    /// Whether every invariant holds.
    pub fn holds(&self) -> bool {
        self.invariants
            .iter()
            .all(|invariant| invariant.broken == 0)
    }
}

const AT_MOST_ONE: usize = 0;
const SUCCEEDED: usize = 1;
const FAILED_FINAL: usize = 2;
const RECORDED: usize = 3;
const ACKNOWLEDGED: usize = 4;
const NOT_IN_PROGRESS: usize = 5;
const NO_INTERNAL: usize = 6;
const NO_REFUSAL: usize = 7;

const RULES: [&str; 8] = [
    "at most one effect per key",
    "succeeded <=> exactly one effect, with the journal's external id (an effect never sits on a released key)",
    "failed_final <=> no effect",
    "every effect has its journal record",
    "every acknowledged report is in the journal",
    "nothing is left in_progress",
    "no INTERNAL, UNKNOWN or DATA_LOSS answer from a server",
    "no intent refused or held (INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND, duplicate intent)",
];

/// Checks every invariant.
pub fn check(facts: &Facts<'_>) -> Verdict {
    let mut verdict = Verdict {
        invariants: RULES
            .iter()
            .map(|rule| Invariant {
                rule,
                ..Invariant::default()
            })
            .collect(),
        ..Verdict::default()
    };
    let none = LedgerKey::default();
    for plan in facts.plans {
        let key = plan.key.as_str();
        let ledger = facts.ledger.get(key).unwrap_or(&none);
        verdict.effects += ledger.effects;
        verdict.provider_replays += ledger.replays;
        if ledger.effects > 1 {
            verdict.fail(AT_MOST_ONE, format!("{key}: {} effects", ledger.effects));
        }
        let Some(row) = facts.rows.get(key) else {
            *verdict.statuses.entry("not_registered".into()).or_default() += 1;
            if ledger.effects > 0 {
                verdict.fail(RECORDED, format!("{key}: an effect and no journal record"));
            }
            if facts.acks.get(key).is_some_and(|acks| !acks.is_empty()) {
                verdict.fail(ACKNOWLEDGED, format!("{key}: acknowledged, but no record"));
            }
            continue;
        };
        let status = OperationStatus::try_from(row.status).unwrap_or(OperationStatus::Unspecified);
        *verdict
            .statuses
            .entry(status_name(status).into())
            .or_default() += 1;
        verdict.looked_up += u64::from(row.reconcile_attempts > 0);
        verdict.leased_more_than_once += u64::from(row.attempt_count > 1);
        match status {
            OperationStatus::Succeeded => {
                let matching = ledger.effect_ids.first() == row.external_id.as_ref();
                if ledger.effects != 1 || !matching {
                    verdict.fail(
                        SUCCEEDED,
                        format!(
                            "{key}: succeeded with {:?}, provider holds {:?}",
                            row.external_id, ledger.effect_ids
                        ),
                    );
                }
            }
            OperationStatus::FailedFinal if ledger.effects > 0 => {
                verdict.fail(
                    FAILED_FINAL,
                    format!("{key}: failed_final, {} effects", ledger.effects),
                );
            }
            OperationStatus::Pending if ledger.effects > 0 => {
                verdict.fail(
                    SUCCEEDED,
                    format!("{key}: released for retry, yet the effect exists"),
                );
            }
            OperationStatus::InProgress => {
                verdict.fail(
                    NOT_IN_PROGRESS,
                    format!("{key}: in_progress at attempt {}", row.attempt_count),
                );
            }
            OperationStatus::Unknown if row.review_required_at.is_some() => verdict.in_review += 1,
            OperationStatus::Unknown => verdict.unknown_not_in_review += 1,
            _ => {}
        }
        for ack in facts.acks.get(key).into_iter().flatten() {
            verdict.acks_checked += 1;
            if let Err(found) = kept(ack, row, facts.histories.get(key)) {
                verdict.fail(
                    ACKNOWLEDGED,
                    format!("{key}: {ack:?} acknowledged, {found}"),
                );
            }
        }
        for error in facts.agent_errors.get(key).into_iter().flatten() {
            if refused(error) {
                verdict.fail(NO_REFUSAL, format!("{key}: {error}"));
            }
        }
    }
    for (rpc, codes) in &facts.server_codes {
        for (code, count) in codes {
            if matches!(code.as_str(), "INTERNAL" | "UNKNOWN" | "DATA_LOSS") {
                verdict.invariants[NO_INTERNAL].broken += count;
                verdict.invariants[NO_INTERNAL]
                    .examples
                    .push(format!("{rpc}: {count} x {code}"));
            }
        }
    }
    verdict
}

impl Verdict {
    fn fail(&mut self, index: usize, example: String) {
        let invariant = &mut self.invariants[index];
        invariant.broken += 1;
        if invariant.examples.len() < 10 {
            invariant.examples.push(example);
        }
    }
}

/// An acknowledged report the journal no longer holds: what the journal holds instead, as
/// the lost-write example of the report describes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the journal holds {} ({external_id:?}) at attempt {attempt_count}",
    status_name(*status)
)]
struct NotKept {
    /// The operation's status in the journal.
    status: OperationStatus,
    /// The provider's id the journal holds, if any.
    external_id: Option<String>,
    /// The journal's attempt count.
    attempt_count: i32,
}

/// Whether the journal still holds what `ack` acknowledged; `Err` says what it holds.
fn kept(ack: &Ack, row: &Operation, history: Option<&Vec<OperationEvent>>) -> Result<(), NotKept> {
    let status = OperationStatus::try_from(row.status).unwrap_or(OperationStatus::Unspecified);
    let holds = |want: OperationStatus, external_id: Option<&String>| {
        status == want && (external_id.is_none() || row.external_id.as_ref() == external_id)
    };
    let in_history = |to: OperationStatus, attempt: i32, reviewer: bool| {
        history.into_iter().flatten().any(|event| {
            event.to_status == to as i32
                && event.attempt_count == attempt
                && (!reviewer || event.actor_kind == ActorKind::Reviewer as i32)
        })
    };
    let ok = match ack {
        Ack::Completed { external_id, .. } => {
            holds(OperationStatus::Succeeded, external_id.as_ref())
        }
        Ack::Failed { .. } => holds(OperationStatus::FailedFinal, None),
        Ack::Unknown { attempt } => in_history(OperationStatus::Unknown, *attempt, false),
        Ack::Resolved {
            attempt,
            resolution,
            external_id,
        } => match resolution.as_str() {
            "succeeded" => holds(OperationStatus::Succeeded, external_id.as_ref()),
            "failed_final" => holds(OperationStatus::FailedFinal, None),
            _ => in_history(OperationStatus::Pending, *attempt, true),
        },
    };
    if ok {
        Ok(())
    } else {
        Err(NotKept {
            status,
            external_id: row.external_id.clone(),
            attempt_count: row.attempt_count,
        })
    }
}

/// Whether an agent's error or outcome means the journal refused or held the intent.
fn refused(error: &str) -> bool {
    [
        "INVALID_ARGUMENT/",
        "ALREADY_EXISTS/",
        "NOT_FOUND/",
        "duplicate_intent_suspected",
    ]
    .iter()
    .any(|prefix| error.starts_with(prefix))
}

/// The status's name as the report writes it.
pub fn status_name(status: OperationStatus) -> &'static str {
    match status {
        OperationStatus::Unspecified => "unspecified",
        OperationStatus::Pending => "pending",
        OperationStatus::InProgress => "in_progress",
        OperationStatus::Unknown => "unknown",
        OperationStatus::Succeeded => "succeeded",
        OperationStatus::FailedFinal => "failed_final",
    }
}

/// Whether an acknowledged report needs the key's history to be checked.
pub fn needs_history(ack: &Ack) -> bool {
    match ack {
        Ack::Unknown { .. } => true,
        Ack::Resolved { resolution, .. } => resolution == "release_for_retry",
        Ack::Completed { .. } | Ack::Failed { .. } => false,
    }
}

#[cfg(test)]
mod tests;
