//! `opjournal-chaos` end to end: the small run (500 intents, every fault kind) keeps every
//! invariant, and a provider that stores a payment twice makes the run fail. Each run starts
//! its own Postgres cluster, two server replicas, two workers and the sandbox from the
//! workspace's binaries (`cargo build --workspace --bins`, as `./scripts/test` does). Nothing
//! here is timed.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Mutex;

use serde_json::Value;

/// The two runs share the machine's two cores: one at a time.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs the suite with `args`; returns its exit code, its stdout and its report.
fn chaos(args: &[&str]) -> (Option<i32>, String, Value) {
    let _one = ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report.json");
    let work = scratch.path().join("work");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_opjournal-chaos"))
        .args(args)
        .arg("--report")
        .arg(&report)
        .arg("--work-dir")
        .arg(&work)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let Ok(text) = std::fs::read_to_string(&report) else {
        panic!("no report ({:?})\n{stdout}\n{stderr}", output.status.code());
    };
    assert!(
        !work.join("pg").exists(),
        "the Postgres cluster must be removed at the end"
    );
    (
        output.status.code(),
        stdout,
        serde_json::from_str(&text).unwrap(),
    )
}

fn broken(report: &Value, rule_starts_with: &str) -> u64 {
    report["verdict"]["invariants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|invariant| {
            invariant["rule"]
                .as_str()
                .unwrap()
                .starts_with(rule_starts_with)
        })
        .unwrap()["broken"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_small_run_under_every_fault_kind_keeps_every_invariant() {
    let (code, stdout, report) = chaos(&[
        "--intents",
        "500",
        "--drive-seconds",
        "30",
        "--settle-seconds",
        "90",
    ]);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(report["passed"], true, "{stdout}");
    for invariant in report["verdict"]["invariants"].as_array().unwrap() {
        assert_eq!(invariant["broken"], 0, "{invariant}");
    }
    let faults = &report["faults_injected"];
    for kind in [
        "provider/commit_then_timeout",
        "provider/fail_before_store",
        "provider/reject",
        "provider/slow",
        "agent/crash_after_call",
        "lost_answer/OperationJournal/BeginOperation",
        "chaos/kill_server",
        "chaos/stop_server",
        "chaos/kill_worker",
        "chaos/stop_worker",
        "chaos/stop_postgres",
        "chaos/kill_postmaster",
        "chaos/client_latency",
        "chaos/client_stall",
        "chaos/client_reset",
        "chaos/db_latency",
        "chaos/db_stall",
        "chaos/db_reset",
        "chaos/partition",
    ] {
        assert!(
            faults[kind].as_u64().unwrap_or(0) >= 1,
            "{kind} was not injected: {faults}"
        );
    }
    let intents: u64 = report["intents"]
        .as_object()
        .unwrap()
        .values()
        .map(|count| count.as_u64().unwrap())
        .sum();
    assert_eq!(intents, 500);
    // The review path ran through the Reconciler API, and the effects were counted.
    let resolved: u64 = report["review"]["resolved"]
        .as_object()
        .unwrap()
        .values()
        .map(|count| count.as_u64().unwrap())
        .sum();
    assert!(resolved >= 1, "{stdout}");
    assert!(report["verdict"]["effects"].as_u64().unwrap() >= 1);
    assert!(report["verdict"]["acks_checked"].as_u64().unwrap() >= 1);
    assert!(report["verdict"]["statuses"].get("in_progress").is_none());
    // Every code the servers answered is listed per RPC, and Begin was answered OK.
    let begin = &report["wire"]["codes"]["OperationJournal/BeginOperation"];
    assert!(begin["OK"].as_u64().unwrap() >= 500, "{begin}");
    assert!(
        stdout.contains("Verdict: every invariant holds."),
        "{stdout}"
    );
}

#[test]
fn a_provider_that_stores_a_payment_twice_fails_the_run() {
    let (code, stdout, report) = chaos(&[
        "--intents",
        "30",
        "--drive-seconds",
        "3",
        "--settle-seconds",
        "60",
        "--no-process-or-network-faults",
        "--sandbox-defect",
        "store-payments-twice",
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    assert_eq!(report["passed"], false);
    assert!(
        broken(&report, "at most one effect per key") >= 1,
        "{stdout}"
    );
    assert!(broken(&report, "succeeded <=>") >= 1, "{stdout}");
    // Only the provider is broken: the journal's own invariants still hold.
    assert_eq!(broken(&report, "every acknowledged report"), 0, "{stdout}");
    assert_eq!(
        broken(&report, "nothing is left in_progress"),
        0,
        "{stdout}"
    );
    assert!(stdout.contains("AN INVARIANT IS BROKEN"), "{stdout}");
}
