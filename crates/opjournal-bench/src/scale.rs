//! The journal at scale: preloading millions of operations in realistic proportions of
//! statuses, timing the purge, and the query plans of the hot-path statements.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use opjournal::store::JournalMaintenance as _;
use opjournal::store::postgres::PgStore;
use serde_json::{Value, json};
use sqlx::{Executor as _, PgPool, Row as _};

/// Share of each status among preloaded operations, per thousand: the steady state of a
/// journal whose operations mostly succeed, with small unknown, in-progress and pending
/// backlogs (the unknown ones not due for a lookup for a day, a fifth of them waiting for
/// review). The oldest half percent is past retention.
pub const MIX_PER_MILLE: [(&str, u32); 5] = [
    ("succeeded", 940),
    ("failed_final", 50),
    ("unknown", 5),
    ("in_progress", 3),
    ("pending", 2),
];

/// Rows written per statement of the preload.
const CHUNK: i64 = 500_000;

/// Preloaded operations `$1..$2` of `count`: number `g`, when it was created, its status.
/// Creation times grow with `g` over the last 35 days and a little more, as a journal
/// appends them, so the oldest half a percent is past its 35 days' retention, and lies
/// where a real journal keeps its oldest rows: together, at the start of the table.
fn rows_sql(count: i64) -> String {
    format!(
        " FROM (SELECT g, \
             now() - make_interval(secs => 3024000 * (1.005 - g::float8 / {count})) AS created, \
             CASE WHEN g % 1000 < 940 THEN 'succeeded' \
                  WHEN g % 1000 < 990 THEN 'failed_final' \
                  WHEN g % 1000 < 995 THEN 'unknown' \
                  WHEN g % 1000 < 998 THEN 'in_progress' \
                  ELSE 'pending' END AS s \
         FROM generate_series($1::bigint, $2::bigint) AS g) AS rows"
    )
}

/// The preload statement: rows `$1..$2` of the mix, each with the action policy `$3`
/// recorded at registration. Keys look like a business's (`payment:order-N:intent-01`).
const PRELOAD_SQL: &str = "\
INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, status, \
    attempt_count, external_id, result_json, error_code, lease_until, lease_id, \
    business_references, unknown_since, next_check_at, reconcile_attempts, created_at, \
    updated_at, review_required_at, review_reason, last_actor_kind, last_actor, last_reason, \
    outcome_reported, action_policy, purge_after) \
SELECT 'default', 'payment:order-' || g || ':intent-01', 'create_payment', \
    encode(sha256(convert_to('preload-' || g, 'UTF8')), 'hex'), s, \
    1, \
    CASE WHEN s = 'succeeded' THEN 'pay_' || to_hex(g) END, \
    CASE WHEN s = 'succeeded' THEN '{\"id\":\"pay_' || to_hex(g) || '\"}' END, \
    CASE s WHEN 'failed_final' THEN 'card_declined' WHEN 'unknown' THEN 'TIMEOUT' END, \
    CASE WHEN s = 'in_progress' THEN now() + interval '1 hour' END, \
    gen_random_uuid(), \
    jsonb_build_object('order_id', g::text), \
    CASE WHEN s = 'unknown' THEN created END, \
    CASE WHEN s = 'unknown' AND g % 5 <> 0 THEN now() + interval '1 day' END, \
    CASE WHEN s = 'unknown' THEN 3 ELSE 0 END, \
    created, created + interval '2 seconds', \
    CASE WHEN s = 'unknown' AND g % 5 = 0 THEN now() - interval '1 hour' END, \
    CASE WHEN s = 'unknown' AND g % 5 = 0 THEN 'deadline_passed' END, \
    CASE WHEN s = 'unknown' THEN 'worker' ELSE 'client' END, '', \
    CASE s WHEN 'succeeded' THEN 'completed' WHEN 'failed_final' THEN 'card_declined' \
        WHEN 'unknown' THEN 'TIMEOUT' WHEN 'pending' THEN 'released_not_found' \
        ELSE 'registered' END, \
    s IN ('succeeded', 'failed_final', 'unknown'), \
    $3::jsonb, \
    CASE WHEN s IN ('succeeded', 'failed_final') THEN \
        created + interval '35 days' END ";

/// The history of preloaded operations `$1..$2`, as the journal's trigger writes it: the
/// registration, then (unless still in progress) the transition to the current status.
const EVENTS_SQL: &str = "\
INSERT INTO operation_events (namespace, operation_key, from_status, to_status, \
    attempt_count, review, actor_kind, actor, reason, occurred_at) \
SELECT 'default', 'payment:order-' || g || ':intent-01', \
    CASE WHEN step = 2 THEN 'in_progress' END, \
    CASE WHEN step = 1 THEN 'in_progress' ELSE s END, \
    1, step = 2 AND s = 'unknown' AND g % 5 = 0, \
    CASE WHEN step = 2 AND s = 'unknown' THEN 'worker' ELSE 'client' END, '', \
    CASE WHEN step = 1 THEN 'registered' WHEN s = 'succeeded' THEN 'completed' \
        WHEN s = 'failed_final' THEN 'card_declined' ELSE 'TIMEOUT' END, \
    created + make_interval(secs => step) ";

/// Loads `count` operations and their history into the journal at `url` (already migrated,
/// holding at least one registered operation whose recorded action policy is copied).
/// Triggers are off for the loading session (the history is written directly); secondary
/// indexes are dropped during the load and built again afterwards, exactly as the catalog
/// defined them; then the tables are vacuumed and analyzed, as autovacuum would leave them.
///
/// Errors: any statement fails (the database is the benchmark's own, dropped afterwards).
pub async fn preload(url: &str, count: i64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(
                    "SET session_replication_role = replica; SET synchronous_commit = off; \
                     SET maintenance_work_mem = '1GB'",
                )
                .await?;
                Ok(())
            })
        })
        .connect(url)
        .await?;
    let policy: Value = sqlx::query_scalar(
        "SELECT action_policy FROM agent_operations WHERE action_policy IS NOT NULL LIMIT 1",
    )
    .fetch_optional(&pool)
    .await?
    .context("the journal holds no registered operation to copy the policy of")?;

    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE schemaname = current_schema() \
           AND tablename IN ('agent_operations', 'operation_events') \
           AND indexname NOT IN ('agent_operations_pkey', 'operation_events_pkey')",
    )
    .fetch_all(&pool)
    .await?;
    let primary_key: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conname = 'agent_operations_pkey'",
    )
    .fetch_one(&pool)
    .await?;
    for (name, _) in &indexes {
        pool.execute(sqlx::AssertSqlSafe(format!("DROP INDEX {name}")))
            .await?;
    }
    pool.execute("ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_pkey")
        .await?;

    let ranges: Vec<(i64, i64)> = (0..(count + CHUNK - 1) / CHUNK)
        .map(|i| (i * CHUNK + 1, ((i + 1) * CHUNK).min(count)))
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut lanes = Vec::new();
    for lane in 0..2 {
        let pool = pool.clone();
        let policy = policy.clone();
        let done = done.clone();
        let mine: Vec<(i64, i64)> = ranges.iter().copied().skip(lane).step_by(2).collect();
        lanes.push(tokio::spawn(async move {
            for (from, to) in mine {
                let rows = rows_sql(count);
                sqlx::query(sqlx::AssertSqlSafe(format!("{PRELOAD_SQL}{rows}")))
                    .bind(from)
                    .bind(to)
                    .bind(&policy)
                    .execute(&pool)
                    .await?;
                let events = format!(
                    "{EVENTS_SQL}{rows} CROSS JOIN generate_series(1, 2) AS step \
                     WHERE step = 1 OR s <> 'in_progress'"
                );
                sqlx::query(sqlx::AssertSqlSafe(events))
                    .bind(from)
                    .bind(to)
                    .execute(&pool)
                    .await?;
                let total = done.fetch_add(to - from + 1, std::sync::atomic::Ordering::Relaxed)
                    + (to - from + 1);
                eprintln!(
                    "[bench] preloaded {total} of {count} operations ({:.0} s)",
                    started.elapsed().as_secs_f64()
                );
            }
            anyhow::Ok(())
        }));
    }
    for lane in lanes {
        lane.await??;
    }
    eprintln!("[bench] building the indexes again");
    pool.execute(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE agent_operations ADD CONSTRAINT agent_operations_pkey {primary_key}"
    )))
    .await?;
    // Two at a time, one per core.
    for pair in indexes.chunks(2) {
        let builds = pair.iter().map(|(_, definition)| {
            let pool = pool.clone();
            let definition = definition.clone();
            async move {
                pool.execute(sqlx::AssertSqlSafe(definition))
                    .await
                    .map(|_| ())
            }
        });
        for result in futures::future::join_all(builds).await {
            result?;
        }
    }
    eprintln!("[bench] vacuum, analyze, checkpoint");
    pool.execute("VACUUM (ANALYZE) agent_operations").await?;
    pool.execute("VACUUM (ANALYZE) operation_events").await?;
    pool.execute("CHECKPOINT").await?;
    pool.close().await;
    Ok(started.elapsed())
}

/// Gives `count` succeeded operations of the journal a retention that has passed, so a
/// purge has work on a journal that is otherwise new (its figure is the baseline of the
/// purge at scale).
pub async fn make_purge_due(pool: &PgPool, count: i64) -> anyhow::Result<()> {
    // Only `purge_after` changes: the journal's triggers allow it on terminal rows and record
    // no event for it.
    sqlx::query(
        "UPDATE agent_operations SET purge_after = now() - interval '1 hour' \
         WHERE (namespace, operation_key) IN ( \
             SELECT namespace, operation_key FROM agent_operations \
             WHERE status = 'succeeded' AND purge_after > now() LIMIT $1)",
    )
    .bind(count)
    .execute(pool)
    .await?;
    Ok(())
}

/// Times `rounds` purge statements of `batch` operations each through the store, as the
/// reconcile worker runs them; milliseconds per statement that deleted `batch` operations
/// (none when fewer than `batch` were due).
pub async fn time_purge(pool: &PgPool, batch: i64, rounds: usize) -> anyhow::Result<Vec<f64>> {
    let store = PgStore::new(pool.clone());
    let mut times = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let purged = store.purge(batch).await?;
        if purged < u64::try_from(batch).unwrap_or(0) {
            break;
        }
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    if times.is_empty() {
        eprintln!("[bench] fewer than {batch} operations to purge: purge not timed");
    }
    Ok(times)
}

/// Purges every operation past retention, as a worker that keeps up would have; returns how
/// many.
pub async fn purge_all(pool: &PgPool, batch: i64) -> anyhow::Result<u64> {
    let store = PgStore::new(pool.clone());
    let mut total = 0;
    loop {
        let purged = store.purge(batch).await?;
        total += purged;
        if purged < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
    }
}

/// The number of operations in the journal, and its size on disk (table, indexes and
/// history) in bytes.
pub async fn journal_size(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM agent_operations), \
                pg_total_relation_size('agent_operations') \
                + pg_total_relation_size('operation_events')",
    )
    .fetch_one(pool)
    .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// `EXPLAIN` of each hot-path statement as the server runs it: prepared, with the generic
/// plan Postgres settles on for a statement executed many times
/// (`plan_cache_mode = force_generic_plan`), so the plan cannot depend on the sample values.
/// Returns (statement name, plan text, whether it reads a table without an index).
pub async fn plans(url: &str) -> anyhow::Result<Vec<(String, String, bool)>> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    connection
        .execute("SET plan_cache_mode = force_generic_plan")
        .await?;
    let mut plans = Vec::new();
    let store = opjournal::store::PgStore::connect_lazy(url, 1)?;
    for (name, sql) in store.explained() {
        let prepare = format!("PREPARE bench_plan AS {sql}");
        connection
            .execute(sqlx::AssertSqlSafe(prepare))
            .await
            .with_context(|| format!("cannot prepare {}", name))?;
        // A generic plan does not depend on the values: every parameter is given as NULL.
        let parameters: i64 = sqlx::query_scalar(
            "SELECT cardinality(parameter_types)::int8 FROM pg_prepared_statements \
             WHERE name = 'bench_plan'",
        )
        .fetch_one(&mut connection)
        .await?;
        let nulls = vec!["NULL"; usize::try_from(parameters).unwrap_or(0)].join(", ");
        let explain = if nulls.is_empty() {
            "EXPLAIN (COSTS OFF) EXECUTE bench_plan".to_owned()
        } else {
            format!("EXPLAIN (COSTS OFF) EXECUTE bench_plan({nulls})")
        };
        // EXPLAIN of a data-changing statement only plans it; nothing is written.
        let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut connection)
            .await
            .with_context(|| format!("cannot explain {}", name))?;
        connection.execute("DEALLOCATE bench_plan").await?;
        let plan = lines.join("\n");
        let scans_table = lines.iter().any(|line| line.contains("Seq Scan"));
        plans.push((name.to_owned(), plan, scans_table));
    }
    Ok(plans)
}

/// The plans as JSON for the report.
pub fn plans_json(plans: &[(String, String, bool)]) -> Value {
    Value::Array(
        plans
            .iter()
            .map(|(name, plan, seq)| json!({"statement": name, "plan": plan, "seq_scan": seq}))
            .collect(),
    )
}
