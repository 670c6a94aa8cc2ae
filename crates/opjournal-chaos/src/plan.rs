//! What happens to each intent: its action and the fault its first provider call (or its
//! agent) meets, drawn from a seeded generator so that a run can be repeated.

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

/// The action an intent performs at the sandbox provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `create_payment`: the provider deduplicates by the idempotency key and can be looked
    /// up by it (the reconcile worker settles unknown outcomes).
    Payment,
    /// `send_email`: no idempotency at the provider and no lookup in the policy (adapter
    /// `kind: none`): an unknown outcome goes to human review, and the suite resolves it
    /// through the Reconciler API from what the provider really holds.
    Email,
}

impl Action {
    /// The action's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Email => "email",
        }
    }

    /// The action type in the policy.
    pub fn action_type(self) -> &'static str {
        match self {
            Self::Payment => "create_payment",
            Self::Email => "send_email",
        }
    }
}

/// The fault an intent's first provider call (or its first agent) meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Nothing injected (process and network faults still apply).
    None,
    /// The provider stores the effect and its answer is lost (`commit-then-timeout`).
    CommitThenTimeout,
    /// The provider answers 503 and stores nothing (`fail-before-store`).
    FailBeforeStore,
    /// The provider refuses for good (`reject`: 402 `card_declined`).
    Reject,
    /// The provider takes longer than the lease (`slow`): the lease must be renewed.
    Slow,
    /// The agent crashes after the provider call returned, before reporting it.
    CrashAfterCall,
}

impl Fault {
    /// The sandbox's `X-Sandbox-Fault` header value, if the provider injects this fault.
    pub fn header(self) -> Option<&'static str> {
        match self {
            Self::CommitThenTimeout => Some("commit-then-timeout"),
            Self::FailBeforeStore => Some("fail-before-store"),
            Self::Reject => Some("reject"),
            Self::Slow => Some("slow"),
            Self::None | Self::CrashAfterCall => None,
        }
    }

    /// The fault's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::CommitThenTimeout => "commit_then_timeout",
            Self::FailBeforeStore => "fail_before_store",
            Self::Reject => "reject",
            Self::Slow => "slow",
            Self::CrashAfterCall => "crash_after_call",
        }
    }
}

/// One intent of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Its position, 0-based.
    pub index: usize,
    /// The idempotency key (also the provider key: the run uses the `default` namespace).
    pub key: String,
    /// What it does.
    pub action: Action,
    /// What its first provider call (or agent) meets.
    pub fault: Fault,
    /// Whether its journal calls go through a relay that loses some of their answers.
    pub lost_answers: bool,
}

impl Plan {
    /// `action/fault`, with `+lost_answers` when its answers may be lost.
    pub fn kind(&self) -> String {
        let lost = if self.lost_answers {
            "+lost_answers"
        } else {
            ""
        };
        format!("{}/{}{lost}", self.action.name(), self.fault.name())
    }
}

/// The faults a payment may meet, and their weights (out of 100).
const PAYMENT_FAULTS: [(Fault, u32); 6] = [
    (Fault::None, 30),
    (Fault::CommitThenTimeout, 17),
    (Fault::FailBeforeStore, 14),
    (Fault::Reject, 12),
    (Fault::Slow, 12),
    (Fault::CrashAfterCall, 15),
];

/// One intent in this many has its journal answers lost now and then.
const LOST_ANSWERS_ONE_IN: u32 = 5;

/// The faults an e-mail meets: each leaves its outcome unknown, so each goes to review.
const EMAIL_FAULTS: [Fault; 3] = [
    Fault::CommitThenTimeout,
    Fault::FailBeforeStore,
    Fault::CrashAfterCall,
];

/// `count` intents, one in eight an e-mail (review path), the rest payments with faults by
/// weight, one in five of either with lost journal answers. The first intents cover every
/// payment fault and every e-mail fault, with and without lost answers, so even a small run
/// has each kind.
pub fn plans(count: usize, seed: u64) -> Vec<Plan> {
    let mut rng = StdRng::seed_from_u64(seed);
    let covered: Vec<(Action, Fault)> = PAYMENT_FAULTS
        .iter()
        .map(|(fault, _)| (Action::Payment, *fault))
        .chain(EMAIL_FAULTS.iter().map(|fault| (Action::Email, *fault)))
        .collect();
    (0..count)
        .map(|index| {
            let (action, fault, lost_answers) = if index < 2 * covered.len() {
                let (action, fault) = covered[index % covered.len()];
                (action, fault, index >= covered.len())
            } else {
                let lost = rng.random_ratio(1, LOST_ANSWERS_ONE_IN);
                if rng.random_ratio(1, 8) {
                    let fault = EMAIL_FAULTS[rng.random_range(0..EMAIL_FAULTS.len())];
                    (Action::Email, fault, lost)
                } else {
                    (Action::Payment, weighted(&mut rng), lost)
                }
            };
            let kind = match action {
                Action::Payment => "pay",
                Action::Email => "mail",
            };
            Plan {
                index,
                key: format!("chaos-{kind}-{index:06}"),
                action,
                fault,
                lost_answers,
            }
        })
        .collect()
}

fn weighted(rng: &mut StdRng) -> Fault {
    let total: u32 = PAYMENT_FAULTS.iter().map(|(_, weight)| weight).sum();
    let mut pick = rng.random_range(0..total);
    for (fault, weight) in PAYMENT_FAULTS {
        if pick < weight {
            return fault;
        }
        pick -= weight;
    }
    Fault::None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_has_every_fault_and_the_same_seed_gives_the_same_plans() {
        let plans = plans(30, 7);
        for lost in [false, true] {
            for (fault, _) in PAYMENT_FAULTS {
                assert!(plans.iter().any(|p| p.action == Action::Payment
                    && p.fault == fault
                    && p.lost_answers == lost));
            }
            for fault in EMAIL_FAULTS {
                assert!(plans.iter().any(|p| p.action == Action::Email
                    && p.fault == fault
                    && p.lost_answers == lost));
            }
        }
        let again = super::plans(30, 7);
        assert!(plans.iter().zip(&again).all(|(a, b)| a.key == b.key
            && a.fault == b.fault
            && a.lost_answers == b.lost_answers));
    }
}
