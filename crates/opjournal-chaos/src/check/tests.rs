#![allow(clippy::unwrap_used)]

use super::*;
use crate::plan::{Action, Fault};

fn plan(key: &str) -> Plan {
    Plan {
        index: 0,
        key: key.into(),
        action: Action::Payment,
        fault: Fault::None,
        lost_answers: false,
    }
}

fn row(key: &str, status: OperationStatus, external_id: Option<&str>) -> Operation {
    Operation {
        operation_key: key.into(),
        status: status as i32,
        attempt_count: 1,
        external_id: external_id.map(str::to_owned),
        ..Operation::default()
    }
}

fn effects(key: &str, ids: &[&str]) -> LedgerKey {
    LedgerKey {
        key: key.into(),
        requests: ids.len() as u64,
        effects: ids.len() as u64,
        replays: 0,
        effect_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
    }
}

/// Checks one key `k` with its row, its effects and its acknowledged reports.
fn one(row: Option<Operation>, ledger: LedgerKey, acks: Vec<Ack>) -> Verdict {
    let plans = [plan("k")];
    let facts = Facts {
        plans: &plans,
        acks: HashMap::from([("k".to_owned(), acks)]),
        rows: row.into_iter().map(|r| ("k".to_owned(), r)).collect(),
        histories: HashMap::new(),
        ledger: HashMap::from([("k".to_owned(), ledger)]),
        server_codes: BTreeMap::new(),
        agent_errors: HashMap::new(),
    };
    check(&facts)
}

fn broken(verdict: &Verdict) -> Vec<&'static str> {
    verdict
        .invariants
        .iter()
        .filter(|invariant| invariant.broken > 0)
        .map(|invariant| invariant.rule)
        .collect()
}

#[test]
fn a_succeeded_key_with_its_one_effect_and_its_acknowledged_completion_holds() {
    let completed = Ack::Completed {
        attempt: 1,
        external_id: Some("pay_1".into()),
    };
    let verdict = one(
        Some(row("k", OperationStatus::Succeeded, Some("pay_1"))),
        effects("k", &["pay_1"]),
        vec![completed],
    );
    assert!(verdict.holds(), "{:?}", broken(&verdict));
    assert_eq!(verdict.effects, 1);
    assert_eq!(verdict.acks_checked, 1);
    assert_eq!((verdict.looked_up, verdict.leased_more_than_once), (0, 0));

    let mut again = row("k", OperationStatus::Succeeded, Some("pay_1"));
    again.attempt_count = 2;
    again.reconcile_attempts = 3;
    let verdict = one(Some(again), effects("k", &["pay_1"]), vec![]);
    assert_eq!((verdict.looked_up, verdict.leased_more_than_once), (1, 1));
}

#[test]
fn two_effects_under_one_key_break_two_invariants() {
    let verdict = one(
        Some(row("k", OperationStatus::Succeeded, Some("pay_1"))),
        effects("k", &["pay_1", "pay_2"]),
        vec![],
    );
    assert_eq!(broken(&verdict), vec![RULES[AT_MOST_ONE], RULES[SUCCEEDED]]);
}

#[test]
fn a_succeeded_key_whose_external_id_the_provider_does_not_hold_is_broken() {
    let verdict = one(
        Some(row("k", OperationStatus::Succeeded, Some("pay_9"))),
        effects("k", &["pay_1"]),
        vec![],
    );
    assert_eq!(broken(&verdict), vec![RULES[SUCCEEDED]]);
}

#[test]
fn an_effect_on_a_failed_or_released_key_or_without_a_record_is_broken() {
    let failed = one(
        Some(row("k", OperationStatus::FailedFinal, None)),
        effects("k", &["pay_1"]),
        vec![],
    );
    assert_eq!(broken(&failed), vec![RULES[FAILED_FINAL]]);
    let released = one(
        Some(row("k", OperationStatus::Pending, None)),
        effects("k", &["pay_1"]),
        vec![],
    );
    assert_eq!(broken(&released), vec![RULES[SUCCEEDED]]);
    let missing = one(None, effects("k", &["pay_1"]), vec![]);
    assert_eq!(broken(&missing), vec![RULES[RECORDED]]);
    // An effect on a key still unknown is waiting to be settled: no invariant is broken.
    let unknown = one(
        Some(row("k", OperationStatus::Unknown, None)),
        effects("k", &["pay_1"]),
        vec![],
    );
    assert!(unknown.holds());
    assert_eq!(unknown.unknown_not_in_review, 1);
}

#[test]
fn an_acknowledged_report_the_journal_does_not_hold_is_a_lost_write() {
    let completed = Ack::Completed {
        attempt: 1,
        external_id: Some("pay_1".into()),
    };
    let verdict = one(
        Some(row("k", OperationStatus::Unknown, None)),
        effects("k", &["pay_1"]),
        vec![completed],
    );
    assert_eq!(broken(&verdict), vec![RULES[ACKNOWLEDGED]]);
    let failed = one(
        Some(row("k", OperationStatus::Succeeded, Some("pay_1"))),
        effects("k", &["pay_1"]),
        vec![Ack::Failed { attempt: 1 }],
    );
    assert_eq!(broken(&failed), vec![RULES[ACKNOWLEDGED]]);
}

#[test]
fn an_acknowledged_unknown_report_must_be_in_the_history() {
    let plans = [plan("k")];
    let event = OperationEvent {
        to_status: OperationStatus::Unknown as i32,
        attempt_count: 2,
        ..OperationEvent::default()
    };
    let mut facts = Facts {
        plans: &plans,
        acks: HashMap::from([("k".to_owned(), vec![Ack::Unknown { attempt: 2 }])]),
        rows: HashMap::from([(
            "k".to_owned(),
            row("k", OperationStatus::Succeeded, Some("pay_1")),
        )]),
        histories: HashMap::from([("k".to_owned(), vec![event])]),
        ledger: HashMap::from([("k".to_owned(), effects("k", &["pay_1"]))]),
        server_codes: BTreeMap::new(),
        agent_errors: HashMap::new(),
    };
    assert!(check(&facts).holds());
    facts.histories.clear();
    assert_eq!(broken(&check(&facts)), vec![RULES[ACKNOWLEDGED]]);
}

#[test]
fn in_progress_rows_internal_answers_and_refused_intents_are_broken() {
    let plans = [plan("k")];
    let facts = Facts {
        plans: &plans,
        acks: HashMap::new(),
        rows: HashMap::from([("k".to_owned(), row("k", OperationStatus::InProgress, None))]),
        histories: HashMap::new(),
        ledger: HashMap::new(),
        server_codes: BTreeMap::from([(
            "OperationJournal/BeginOperation".to_owned(),
            BTreeMap::from([("OK".to_owned(), 3), ("INTERNAL".to_owned(), 1)]),
        )]),
        agent_errors: HashMap::from([(
            "k".to_owned(),
            vec!["ALREADY_EXISTS/IDEMPOTENCY_KEY_REUSED".to_owned()],
        )]),
    };
    let verdict = check(&facts);
    assert_eq!(
        broken(&verdict),
        vec![
            RULES[NOT_IN_PROGRESS],
            RULES[NO_INTERNAL],
            RULES[NO_REFUSAL]
        ]
    );
}
