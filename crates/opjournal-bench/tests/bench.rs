//! `opjournal-bench` runs end to end on a small scale: pgbench on the reference SQL, every
//! journal scenario through the real server, the reconcile backlog, a preloaded journal and
//! its query plans. Nothing here is timed: the figures are the benchmark's to report; this
//! checks that one command produces all of them, with every answer the one promised.

#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::Value;

fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

#[tokio::test]
async fn one_command_reports_every_figure_with_ratios_to_pgbench() {
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report.json");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal-bench"))
        .args(["--database-url", &admin_url()])
        .args(["--clients", "2", "--duration", "1", "--warmup", "0.5"])
        .args(["--high-clients", "4"])
        .args(["--burst-callers", "60", "--burst-connections", "4"])
        .args([
            "--backlog",
            "40",
            "--preload",
            "30000",
            "--purge-batch",
            "40",
        ])
        .arg("--report")
        .arg(&report)
        .env("TMPDIR", scratch.path())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");

    // The table: pgbench's figures, the journal's with ratios, the targets.
    for line in [
        "minimal-lifecycle.sql",
        "seed-lifecycle.sql",
        "lifecycle (Begin + Complete)",
        "replay (Begin, succeeded key)",
        "conflict (same key, other payload)",
        "reconcile worker on an unknown backlog",
        "minimal-lifecycle.sql, 4 clients",
        "journal, empty journal, 4 clients",
        "lifecycle / pgbench minimal, 2 clients",
        "lifecycle / pgbench minimal, 4 clients",
        "Begin p99 at half that rate, 4 clients, ms",
        "Postgres CPU per lifecycle / minimal txn's, 2 clients",
        "Postgres CPU per lifecycle / minimal txn's, 4 clients",
        "figures an earlier target bound:",
        "replay / pgbench minimal, 2 clients",
        "lifecycle throughput empty / preloaded",
        "Begin p99 preloaded / empty",
        "server peak RSS over every run, MiB",
        "server peak RSS, MiB",
        "gRPC floor: lifecycle, answered from memory",
        "server / gRPC floor, CPU per lifecycle",
        "server CPU per lifecycle / gRPC floor's, 2 clients",
        "server CPU per lifecycle / gRPC floor's, 4 clients",
        "burst: 60 callers over 4 connections",
        "burst of 60 callers: 0 refused",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let pgbench = report["pgbench"].as_array().unwrap();
    // Both scripts at both client counts.
    assert_eq!(pgbench.len(), 4);
    for script in pgbench {
        assert!(script["tps"].as_f64().unwrap() > 0.0, "{script}");
        assert!(
            script["cpu"]["postgres_ms_per_op"].as_f64().is_some(),
            "{script}"
        );
    }
    let clients: Vec<u64> = pgbench
        .iter()
        .map(|s| s["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [2, 2, 4, 4]);
    // The second client count: the lifecycle and its open loop, every answer checked.
    let high = &report["high_clients"];
    assert_eq!(high["clients"], 4, "{high}");
    for run in ["lifecycle", "open_loop"] {
        let run = &high["runs"][run];
        assert!(run["ok"].as_u64().unwrap() > 0, "{run}");
        assert_eq!(run["errors"], 0, "{run}");
        assert!(!run["latency"].as_object().unwrap().is_empty(), "{run}");
    }
    assert!(high["server_memory"]["peak_rss_mib"].as_f64().unwrap() > 0.0);
    for journal in ["empty", "preloaded"] {
        let runs = &report[journal]["runs"];
        for run in ["lifecycle", "replay", "conflict", "open_loop"] {
            let run = &runs[run];
            assert!(run["ok"].as_u64().unwrap() > 0, "{journal}: {run}");
            assert_eq!(run["errors"], 0, "{journal}: {run}");
            assert!(!run["latency"].as_object().unwrap().is_empty(), "{run}");
        }
        let reconcile = &report[journal]["reconcile"];
        assert_eq!(reconcile["succeeded"], 40, "{reconcile}");
        // Exactly one effect per operation at the provider: looked up, never re-made.
        assert_eq!(reconcile["provider_stats"]["effects"], 40, "{reconcile}");
        assert!(
            report[journal]["server_memory"]["peak_rss_mib"]
                .as_f64()
                .unwrap()
                > 0.0
        );
        assert!(
            !report[journal]["purge_batch_ms"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }
    assert_eq!(report["preloaded"]["operations"].as_i64().unwrap(), 30_001);
    // The gRPC floor at both client counts, beside the journal's server.
    let floors = report["grpc_floor"].as_array().unwrap();
    assert_eq!(floors.len(), 2, "{floors:?}");
    for floor in floors {
        assert_eq!(floor["lifecycle"]["errors"], 0, "{floor}");
        assert!(floor["lifecycle"]["ok"].as_u64().unwrap() > 0, "{floor}");
        assert!(floor["server_to_floor"].as_f64().unwrap() > 0.0, "{floor}");
    }
    // The burst: every caller's lifecycle answered, none refused, with the server's defaults.
    let burst = &report["burst"];
    assert_eq!(burst["callers"], 60, "{burst}");
    assert_eq!(burst["lifecycles_ok"], 60, "{burst}");
    assert_eq!(burst["refused"], 0, "{burst}");
    assert_eq!(burst["errors"], 0, "{burst}");
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 15);
    for target in targets {
        assert!(target["value"].as_f64().is_some(), "{target}");
        assert!(target["met"].is_boolean(), "{target}");
    }
    // The six performance targets, each one there.
    let numbers: std::collections::BTreeSet<u64> = targets
        .iter()
        .filter_map(|t| t["number"].as_u64())
        .collect();
    assert_eq!(numbers, (1..=6).collect());

    // The hot path's plans on the preloaded journal: every statement uses an index.
    let plans = report["preloaded"]["plans"].as_array().unwrap();
    assert!(!plans.is_empty());
    for plan in plans {
        assert_eq!(plan["seq_scan"], false, "{plan}");
    }
}
