//! The run's report: a table on stdout and the same figures as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::agent::Record;
use crate::chaos::Chaos;
use crate::check::{Invariant, Verdict};
use crate::plan::Plan;
use crate::relay::WireCounts;
use crate::reviewer::ReviewCounts;
use crate::run::RunConfig;

/// What [`Report::new`] is made from.
pub struct Figures<'a> {
    /// The run's settings.
    pub config: &'a RunConfig,
    /// The intents.
    pub plans: &'a [Plan],
    /// What the agents did, in plan order.
    pub records: &'a [Record],
    /// The check.
    pub verdict: Verdict,
    /// What the relays saw.
    pub wire: WireCounts,
    /// What the reviewer did.
    pub review: ReviewCounts,
    /// Process and network faults injected.
    pub chaos: BTreeMap<Chaos, u64>,
    /// Provider calls made with each sandbox fault.
    pub provider_faults: BTreeMap<String, u64>,
    /// Bringing the stand up.
    pub setup: Duration,
    /// From the first intent to the end of the faults.
    pub faults_stopped: Duration,
    /// From the first intent to the last agent's end.
    pub driven: Duration,
    /// The whole run, set-up included (not the read-back).
    pub total: Duration,
}

/// The report, as written to JSON.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Whether every invariant held.
    pub passed: bool,
    /// The settings.
    pub settings: BTreeMap<&'static str, serde_json::Value>,
    /// Seconds: `setup`, `faults` (first intent to the last fault), `driven` (first intent to
    /// the last agent), `total`.
    pub wall_seconds: BTreeMap<&'static str, f64>,
    /// Intents per action and fault (`payment/slow`, `email/crash_after_call+lost_answers`).
    pub intents: BTreeMap<String, u64>,
    /// Intents that reached a final outcome, and those still open at the deadline.
    pub finished: u64,
    /// Intents still open at the deadline.
    pub unfinished: u64,
    /// Faults injected: provider faults, lost answers per RPC, agent crashes, process and
    /// network faults.
    pub faults_injected: BTreeMap<String, u64>,
    /// The check: statuses, effects, invariants.
    pub verdict: Verdict,
    /// The reviewer's resolutions and errors.
    pub review: ReviewCounts,
    /// The relays' view: status codes the servers answered per RPC, lost answers, calls to
    /// a replica that was down, answers cut mid-stream.
    pub wire: WireCounts,
    /// Errors `execute` returned to the agents, as `CODE/REASON` (transport-made ones say
    /// `TRANSPORT`).
    pub client_errors: BTreeMap<String, u64>,
    /// `execute` calls, provider calls, and agents that crashed.
    pub agent_totals: BTreeMap<&'static str, u64>,
}

impl Report {
    /// Gathers the figures.
    pub fn new(figures: Figures<'_>) -> Self {
        let config = figures.config;
        let mut intents = BTreeMap::new();
        for plan in figures.plans {
            *intents.entry(plan.kind()).or_default() += 1;
        }
        let mut client_errors = BTreeMap::new();
        let mut totals = BTreeMap::new();
        for record in figures.records {
            for (error, count) in &record.errors {
                *client_errors.entry(error.clone()).or_default() += count;
            }
            *totals.entry("executions").or_default() += u64::from(record.executions);
            *totals.entry("provider_calls").or_default() += u64::from(record.provider_calls);
            *totals.entry("agent_crashes").or_default() += u64::from(record.crashes);
        }
        let finished = figures.records.iter().filter(|r| r.finished).count() as u64;
        let mut faults = BTreeMap::new();
        for (fault, count) in &figures.provider_faults {
            faults.insert(format!("provider/{fault}"), *count);
        }
        for (rpc, count) in &figures.wire.lost_answers {
            faults.insert(format!("lost_answer/{rpc}"), *count);
        }
        faults.insert(
            "agent/crash_after_call".into(),
            totals.get("agent_crashes").copied().unwrap_or(0),
        );
        for (kind, count) in &figures.chaos {
            let name = serde_json::to_value(kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            faults.insert(format!("chaos/{name}"), *count);
        }
        let seconds = |d: Duration| (d.as_secs_f64() * 10.0).round() / 10.0;
        let settings = BTreeMap::from([
            ("intents", config.intents.into()),
            ("drive_seconds", config.drive.as_secs().into()),
            ("settle_seconds", config.settle.as_secs().into()),
            ("concurrency", config.concurrency.into()),
            ("seed", config.seed.into()),
            ("process_and_network_faults", config.chaos.into()),
            ("lose_probability", config.stand.lose_probability.into()),
            ("sandbox_defect", config.stand.sandbox_defect.clone().into()),
        ]);
        Self {
            passed: figures.verdict.holds(),
            settings,
            wall_seconds: BTreeMap::from([
                ("setup", seconds(figures.setup)),
                ("faults", seconds(figures.faults_stopped)),
                ("driven", seconds(figures.driven)),
                ("total", seconds(figures.total)),
            ]),
            intents,
            finished,
            unfinished: figures.records.len() as u64 - finished,
            faults_injected: faults,
            verdict: figures.verdict,
            review: figures.review,
            wire: figures.wire,
            client_errors,
            agent_totals: totals,
        }
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let total: u64 = self.intents.values().sum();
        let _ = writeln!(out, "\nopjournal-chaos: {total} intents");
        let _ = writeln!(
            out,
            "  wall time: set-up {}s, faults {}s, all agents done {}s, total {}s",
            self.wall_seconds["setup"],
            self.wall_seconds["faults"],
            self.wall_seconds["driven"],
            self.wall_seconds["total"]
        );
        section(&mut out, "intents by action/fault", &self.intents);
        section(&mut out, "faults injected", &self.faults_injected);
        let verdict = &self.verdict;
        let mut outcomes = verdict.statuses.clone();
        outcomes.insert("unknown, in review".into(), verdict.in_review);
        outcomes.insert(
            "unknown, not in review".into(),
            verdict.unknown_not_in_review,
        );
        outcomes.insert("intents finished by their agent".into(), self.finished);
        outcomes.insert("effects at the provider".into(), verdict.effects);
        outcomes.insert(
            "repeat calls the provider deduplicated".into(),
            verdict.provider_replays,
        );
        outcomes.insert("acknowledged reports checked".into(), verdict.acks_checked);
        outcomes.insert("keys looked up by a worker".into(), verdict.looked_up);
        outcomes.insert(
            "keys leased more than once".into(),
            verdict.leased_more_than_once,
        );
        section(&mut out, "outcomes", &outcomes);
        section(&mut out, "review (Reconciler API)", &self.review.resolved);
        let _ = writeln!(
            out,
            "\n  gRPC codes the servers answered, per RPC (at the relays)"
        );
        for (rpc, codes) in &self.wire.codes {
            let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let _ = writeln!(out, "    {rpc:<42} {}", codes.join(", "));
        }
        for (title, counts) in [
            (
                "calls to a replica that was down, per RPC",
                &self.wire.unreachable,
            ),
            ("answers cut mid-stream, per RPC", &self.wire.broken_answers),
        ] {
            section(&mut out, title, counts);
        }
        section(
            &mut out,
            "errors execute returned to the agents",
            &self.client_errors,
        );
        section(&mut out, "errors of the review calls", &self.review.errors);
        let _ = writeln!(out, "\n  invariants");
        for Invariant {
            rule,
            broken,
            examples,
        } in &verdict.invariants
        {
            let mark = if *broken == 0 { "ok    " } else { "BROKEN" };
            let _ = writeln!(out, "    {mark} {rule}: {broken}");
            for example in examples {
                let _ = writeln!(out, "             {example}");
            }
        }
        let verdict_line = if self.passed {
            "every invariant holds"
        } else {
            "AN INVARIANT IS BROKEN"
        };
        let _ = writeln!(out, "\nVerdict: {verdict_line}.");
        out
    }
}

fn section<K: std::fmt::Display>(out: &mut String, title: &str, counts: &BTreeMap<K, u64>) {
    let _ = writeln!(out, "\n  {title}");
    if counts.is_empty() {
        let _ = writeln!(out, "    (none)");
    }
    for (name, count) in counts {
        let _ = writeln!(out, "    {:<54} {count:>8}", name.to_string());
    }
}
