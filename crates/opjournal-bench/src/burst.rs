//! The burst: many callers arriving at one instant. `--burst-callers` callers, spread over
//! `--burst-connections` HTTP/2 connections, each run ONE lifecycle (Begin of a new key,
//! then Complete); every caller is connected and has its request built before a barrier
//! releases them all at once, against a server with its default limits. Calls past the
//! server's in-flight budget wait in its admission queue: the target is that none is
//! refused. See docs/performance.md, "The burst".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{BeginOperationRequest, CompleteOperationRequest, Decision};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tonic::transport::Channel;

use crate::{Target, calls, load};

/// How one call of the burst was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// The promised answer (EXECUTE for the Begin of a new key, OK for its Complete).
    Ok,
    /// Refused by the server (`RESOURCE_EXHAUSTED`): `CODE / REASON`.
    Refused(String),
    /// Any other answer or failure, described.
    Error(String),
}

/// What one caller saw: the answer to each call it made, and when.
struct CallerOutcome {
    answers: Vec<(&'static str, Answer)>,
    /// Instant the caller was released (after the barrier).
    released: Instant,
    /// Instant of its last answer.
    finished: Instant,
    /// Begin latency, when its Begin was answered as promised.
    begin: Option<Duration>,
    /// Lifecycle latency, when both calls were answered as promised.
    lifecycle: Option<Duration>,
}

/// The outcome of one burst.
pub struct BurstRun {
    /// Callers released at once, each running one lifecycle.
    pub callers: usize,
    /// HTTP/2 connections the callers were spread over.
    pub connections: usize,
    /// Calls (Begins and Completes) answered as promised.
    pub calls_ok: u64,
    /// Lifecycles whose both calls were answered as promised.
    pub lifecycles_ok: u64,
    /// Calls refused by the server, by `CODE / REASON` (`-` without an `ErrorInfo`).
    pub refused: BTreeMap<String, u64>,
    /// Calls answered otherwise (another status, a wrong decision, a transport error), by
    /// call and code or decision.
    pub errors: BTreeMap<String, u64>,
    /// The first of those other errors, in full.
    pub first_error: Option<String>,
    /// Begin latencies in microseconds, from the release, of the Begins answered EXECUTE.
    pub begin: Histogram<u64>,
    /// Lifecycle latencies in microseconds, from the release to the Complete's answer.
    pub lifecycle: Histogram<u64>,
    /// From the release until the last answer.
    pub wall: Duration,
    /// The server's memory after the burst (see `rss` in main.rs).
    pub rss: Value,
}

impl BurstRun {
    /// Calls refused, of every code and reason.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    /// Calls answered other than as promised, refusals aside.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The burst for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "callers": self.callers,
            "connections": self.connections,
            "calls_ok": self.calls_ok,
            "lifecycles_ok": self.lifecycles_ok,
            "refused": self.refused_total(),
            "refused_by_reason": self.refused,
            "errors": self.errors_total(),
            "errors_by_kind": self.errors,
            "first_error": self.first_error,
            "latency": {
                "begin": latency_json(&self.begin),
                "lifecycle": latency_json(&self.lifecycle),
            },
            "wall_seconds": self.wall.as_secs_f64(),
            "server_memory": self.rss,
        })
    }
}

fn latency_json(h: &Histogram<u64>) -> Value {
    let ms = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0);
    json!({
        "count": h.len(),
        "p50_ms": ms(0.50),
        "p99_ms": ms(0.99),
        "max_ms": (!h.is_empty()).then(|| h.max() as f64 / 1000.0),
    })
}

/// Runs the burst over `channels` (connected HTTP/2 connections, at least one): starts
/// `callers` callers (round-robin over the channels) that each build their Begin of a new
/// key (tagged with `run`) and wait at one barrier, then releases them all at once and
/// collects every answer. [`BurstRun::rss`] is left for the caller to fill.
pub async fn run(channels: &[Channel], callers: usize, run: &str) -> BurstRun {
    let barrier = Arc::new(Barrier::new(callers));
    let tasks: Vec<_> = (0..callers)
        .map(|n| {
            let channel = channels[n % channels.len()].clone();
            let key = calls::key(run, "b", n, 0);
            let request = BeginOperationRequest {
                namespace: String::new(),
                operation_key: key,
                action_type: calls::ACTION.to_owned(),
                payload_json: calls::payload(n as u64, 0),
                ..BeginOperationRequest::default()
            };
            tokio::spawn(caller(channel, request, barrier.clone()))
        })
        .collect();
    let mut outcomes = Vec::with_capacity(callers);
    for task in tasks {
        outcomes.push(
            task.await
                .map_err(|join| format!("caller task failed: {join}")),
        );
    }
    tally(callers, channels.len(), outcomes)
}

/// One caller: waits at `barrier`, then Begin of its key and, if answered EXECUTE, Complete.
async fn caller(
    channel: Channel,
    request: BeginOperationRequest,
    barrier: Arc<Barrier>,
) -> CallerOutcome {
    let mut client = OperationJournalClient::new(channel);
    barrier.wait().await;
    let released = Instant::now();
    let begun = client.begin_operation(request).await;
    let begin_elapsed = released.elapsed();
    let mut outcome = CallerOutcome {
        answers: Vec::with_capacity(2),
        released,
        finished: Instant::now(),
        begin: None,
        lifecycle: None,
    };
    let response = match begun {
        Ok(response) => response.into_inner(),
        Err(status) => {
            outcome.answers.push(("Begin", classify(&status)));
            return outcome;
        }
    };
    let decision = Decision::try_from(response.decision).unwrap_or(Decision::Unspecified);
    if decision != Decision::Execute {
        let got = format!("expected DECISION_EXECUTE, got {}", decision.as_str_name());
        outcome.answers.push(("Begin", Answer::Error(got)));
        return outcome;
    }
    outcome.answers.push(("Begin", Answer::Ok));
    outcome.begin = Some(begin_elapsed);
    let completed = client
        .complete_operation(CompleteOperationRequest {
            lease_token: response.lease_token,
            external_id: "ext-bench".to_owned(),
            result_json: r#"{"id":"ext"}"#.to_owned(),
        })
        .await;
    outcome.finished = Instant::now();
    match completed {
        Ok(_) => {
            outcome.answers.push(("Complete", Answer::Ok));
            outcome.lifecycle = Some(released.elapsed());
        }
        Err(status) => outcome.answers.push(("Complete", classify(&status))),
    }
    outcome
}

/// A gRPC status as a burst answer: `RESOURCE_EXHAUSTED` is a refusal (the server shed the
/// call), anything else an error; both named by code, `ErrorInfo` reason and, when the
/// server names it, the limit that refused (`limit` in the `ErrorInfo`'s metadata).
fn classify(status: &tonic::Status) -> Answer {
    use tonic_types::StatusExt as _;
    let info = status.get_details_error_info();
    let mut kind = format!(
        "{} / {}",
        code_name(status.code()),
        info.as_ref().map_or("-", |info| info.reason.as_str())
    );
    if let Some(limit) = info.as_ref().and_then(|info| info.metadata.get("limit")) {
        kind.push_str(&format!(" (limit {limit})"));
    }
    if status.code() == tonic::Code::ResourceExhausted {
        Answer::Refused(kind)
    } else {
        Answer::Error(format!("{kind}: {}", status.message()))
    }
}

/// A gRPC code's canonical name (`RESOURCE_EXHAUSTED`), from tonic's (`ResourceExhausted`).
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// Adds up every caller's outcome (or its task's failure).
fn tally(
    callers: usize,
    connections: usize,
    outcomes: Vec<Result<CallerOutcome, String>>,
) -> BurstRun {
    let mut burst = BurstRun {
        callers,
        connections,
        calls_ok: 0,
        lifecycles_ok: 0,
        refused: BTreeMap::new(),
        errors: BTreeMap::new(),
        first_error: None,
        begin: load::histogram(),
        lifecycle: load::histogram(),
        wall: Duration::ZERO,
        rss: Value::Null,
    };
    let (mut released, mut finished) = (None::<Instant>, None::<Instant>);
    for outcome in outcomes {
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(failure) => {
                *burst
                    .errors
                    .entry("caller task failed".to_owned())
                    .or_default() += 1;
                burst.first_error.get_or_insert(failure);
                continue;
            }
        };
        released = Some(released.map_or(outcome.released, |r| r.min(outcome.released)));
        finished = Some(finished.map_or(outcome.finished, |f| f.max(outcome.finished)));
        for (call, answer) in outcome.answers {
            match answer {
                Answer::Ok => burst.calls_ok += 1,
                Answer::Refused(kind) => *burst.refused.entry(kind).or_default() += 1,
                Answer::Error(message) => {
                    let kind = message.split(':').next().unwrap_or("").to_owned();
                    *burst.errors.entry(format!("{call}: {kind}")).or_default() += 1;
                    burst
                        .first_error
                        .get_or_insert(format!("{call}: {message}"));
                }
            }
        }
        if let Some(begin) = outcome.begin {
            burst.begin.saturating_record(micros(begin));
        }
        if let Some(lifecycle) = outcome.lifecycle {
            burst.lifecycles_ok += 1;
            burst.lifecycle.saturating_record(micros(lifecycle));
        }
    }
    if let (Some(released), Some(finished)) = (released, finished) {
        burst.wall = finished.saturating_duration_since(released);
    }
    burst
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The burst's lines in the table: callers, calls answered, refused and other errors (by
/// code and reason), the latencies of Begin and of the lifecycle, and the wall time.
pub fn print(burst: &BurstRun) {
    println!(
        "burst: {} callers over {} connections, one lifecycle each, released at once",
        burst.callers, burst.connections
    );
    println!(
        "  calls answered OK {}, lifecycles {}, refused {}, other errors {}",
        burst.calls_ok,
        burst.lifecycles_ok,
        burst.refused_total(),
        burst.errors_total()
    );
    for (kind, count) in &burst.refused {
        println!("  refused: {kind}: {count}");
    }
    for (kind, count) in &burst.errors {
        println!("  ! error: {kind}: {count}");
    }
    for (stage, h) in [("Begin", &burst.begin), ("lifecycle", &burst.lifecycle)] {
        let ms = |v: Option<u64>| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{:.2}", v as f64 / 1000.0))
        };
        let some = |v: u64| (!h.is_empty()).then_some(v);
        println!(
            "  {stage:<10} p50 {} ms, p99 {} ms, max {} ms ({} answered)",
            ms(some(h.value_at_quantile(0.50))),
            ms(some(h.value_at_quantile(0.99))),
            ms(some(h.max())),
            h.len()
        );
    }
    println!(
        "  wall time from the release to the last answer: {:.3} s",
        burst.wall.as_secs_f64()
    );
    let peak = burst.rss["peak_rss_mib"].as_f64();
    println!(
        "  server peak RSS, MiB: {}",
        peak.map_or_else(|| "-".to_owned(), |mib| format!("{mib:.2}"))
    );
    if let Some(error) = &burst.first_error {
        println!("  ! burst: {error}");
    }
}

/// The burst's target: no call of `callers` refused and none answered otherwise. Unmeasured
/// when the burst did not run.
pub fn target(callers: usize, burst: Option<&BurstRun>) -> Target {
    let errors = burst.map_or(0, BurstRun::errors_total);
    Target::new(
        Some(5),
        format!("burst of {callers} callers: 0 refused"),
        burst.map(|b| b.refused_total() as f64),
        "0",
        move |refused| refused == 0.0 && errors == 0,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn outcome(answers: Vec<(&'static str, Answer)>, ms: u64) -> CallerOutcome {
        let released = Instant::now();
        let ok = answers.iter().all(|(_, a)| *a == Answer::Ok);
        CallerOutcome {
            begin: matches!(answers.first(), Some((_, Answer::Ok)))
                .then(|| Duration::from_millis(ms)),
            lifecycle: (ok && answers.len() == 2).then(|| Duration::from_millis(2 * ms)),
            answers,
            released,
            finished: released + Duration::from_millis(2 * ms),
        }
    }

    #[test]
    fn refusals_and_errors_are_counted_apart_and_fail_the_target() {
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
        assert_eq!(code_name(tonic::Code::Ok), "OK");
        let refused = Answer::Refused("RESOURCE_EXHAUSTED / SERVER_OVERLOADED".to_owned());
        let outcomes = vec![
            Ok(outcome(
                vec![("Begin", Answer::Ok), ("Complete", Answer::Ok)],
                5,
            )),
            Ok(outcome(vec![("Begin", refused.clone())], 1)),
            Ok(outcome(
                vec![("Begin", Answer::Ok), ("Complete", refused)],
                7,
            )),
        ];
        let burst = tally(3, 2, outcomes);
        assert_eq!((burst.calls_ok, burst.lifecycles_ok), (3, 1));
        assert_eq!(burst.refused_total(), 2);
        assert_eq!(burst.errors_total(), 0);
        assert_eq!(burst.begin.len(), 2);
        assert!(burst.wall >= Duration::from_millis(14));
        assert_eq!(target(3, Some(&burst)).met, Some(false));
        assert_eq!(target(3, None).met, None);

        let clean = tally(
            1,
            1,
            vec![Ok(outcome(
                vec![("Begin", Answer::Ok), ("Complete", Answer::Ok)],
                3,
            ))],
        );
        assert_eq!(target(1, Some(&clean)).met, Some(true));
        let wrong = tally(
            1,
            1,
            vec![Ok(outcome(vec![("Begin", Answer::Error("x".into()))], 3))],
        );
        assert_eq!(wrong.errors_total(), 1);
        assert_eq!(
            target(1, Some(&wrong)).met,
            Some(false),
            "an error fails the target"
        );
    }
}
