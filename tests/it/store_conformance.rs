//! The storage conformance suite: one set of cases, each run against Postgres
//! (`postgres::<case>`, a fresh database per case) and against the embedded SQLite journal
//! (`sqlite::<case>`, a fresh file per case), with identical expectations. It pins what the
//! rest of the service relies on: atomic register-and-claim, compare-and-set on the state the
//! caller read, leases measured by the database clock, one history entry per transition with
//! its actor, batch claims that never overlap (a second pool on the same database stands for a
//! second process), the sweep, retention, and the database refusing what no code path may do.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::{TestDb, a_statement_waits_for_a_lock, on_pool};
use opjournal::app::Database;
use opjournal::domain::canonical::RequestHash;
use opjournal::domain::escalation::{EventType, event_for};
use opjournal::domain::lease::{AttemptId, LeaseToken};
use opjournal::domain::model::{
    ActionType, ActorKind, Attribution, ErrorCode, ExternalId, Namespace, OperationKey,
    OperationRecord, Status,
};
use opjournal::domain::policy::Policy;
use opjournal::domain::transition::EscalationReason;
use opjournal::journal::{
    BeginOutcome, Complete, Fail, Journal, Renew, ReportUnknown, RequestLimits,
};
use opjournal::store::{
    Claim, Clock, DeliveryOutcome, DeliveryState, HistoryQuery, JournalMaintenance, JournalStore,
    ListQuery, Lookup, NewOperation, OutboxEntry, Registration, Resolution, ReviewQuery,
    SameRequest, SearchQuery, Settled, Settlement, StateCount,
};
use sqlx::PgPool;
use uuid::Uuid;

/// One backend under test: its store, and its database for the few changes no store method
/// makes (ageing rows, attempts to break the rules).
struct Fixture {
    db: TestDb,
    store: Arc<dyn JournalStore>,
    /// The statements' clock: moved forward to end leases instead of sleeping.
    clock: Clock,
}

impl Fixture {
    fn postgres(pool: PgPool) -> Self {
        let db = TestDb::Postgres(pool);
        let database = db.database();
        Self {
            store: database.store(),
            clock: database.clock().clone(),
            db,
        }
    }

    async fn sqlite() -> Self {
        let db = TestDb::sqlite().await;
        let database = db.database();
        Self {
            store: database.store(),
            clock: database.clock().clone(),
            db,
        }
    }

    /// Another pool on the same database, as a second process would open it.
    fn second_store(&self) -> Arc<dyn JournalStore> {
        Database::connect_lazy(&self.db.url(), 5)
            .unwrap()
            .with_clock(self.clock.clone())
            .store()
    }

    /// The same change in each dialect; `Err` when the database refuses it.
    async fn execute(&self, postgres: &str, sqlite: &str) -> Result<u64, sqlx::Error> {
        let sql = match &self.db {
            TestDb::Postgres(_) => postgres,
            TestDb::Sqlite { .. } => sqlite,
        };
        on_pool!(&self.db, |pool| {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
        })
    }

    /// SQL both dialects accept.
    async fn execute_both(&self, sql: &str) -> Result<u64, sqlx::Error> {
        self.execute(sql, sql).await
    }

    /// Moves the retention deadline of every terminal operation `days` into the past.
    async fn age_retention(&self, days: u32) {
        self.execute(
            &format!(
                "UPDATE agent_operations SET purge_after = purge_after - interval '{days} days' \
                 WHERE purge_after IS NOT NULL"
            ),
            &format!(
                "UPDATE agent_operations \
                 SET purge_after = strftime('%Y-%m-%dT%H:%M:%fZ', purge_after, '-{days} days') \
                 WHERE purge_after IS NOT NULL"
            ),
        )
        .await
        .unwrap();
    }

    async fn get(&self, key: &str) -> OperationRecord {
        self.store
            .get(&ns(), &OperationKey::parse(key).unwrap())
            .await
            .unwrap()
            .unwrap()
    }

    async fn history(&self, key: &str) -> Vec<(Option<Status>, Status, i32, bool, Who)> {
        self.store
            .history(&HistoryQuery {
                namespace: ns(),
                operation_key: OperationKey::parse(key).unwrap(),
                after_event_id: 0,
                limit: 1000,
            })
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.from_status,
                    e.to_status,
                    e.attempt_count,
                    e.review_required,
                    (e.actor_kind, e.actor, e.reason),
                )
            })
            .collect()
    }

    async fn register(&self, key: &str, lease: Duration) -> OperationRecord {
        inserted(
            self.store
                .register(&new_operation(key, lease))
                .await
                .unwrap(),
        )
        .unwrap()
    }

    /// A registered operation whose lease ended without a report: swept to unknown.
    async fn unknown_by_sweep(&self, key: &str) -> OperationRecord {
        let record = self.register(key, Duration::from_millis(100)).await;
        self.clock.advance(Duration::from_millis(400));
        assert_eq!(self.store.sweep_expired_leases(10, "w").await.unwrap(), 1);
        let swept = self.get(key).await;
        assert_eq!(swept.status, Status::Unknown);
        OperationRecord {
            lease_id: record.lease_id,
            ..swept
        }
    }

    /// Resolves `read` as `by` says, expecting the resolution to apply.
    async fn resolved(
        &self,
        read: &OperationRecord,
        resolution: &Resolution,
        by: &Attribution,
        lookup: Lookup,
    ) -> OperationRecord {
        self.store
            .resolve(read, resolution, by, lookup)
            .await
            .unwrap()
            .unwrap()
    }

    /// A registered operation whose holder reported a timeout: unknown, due for a lookup now.
    async fn unknown(&self, key: &str) -> OperationRecord {
        let record = self.register(key, LEASE).await;
        self.store
            .settle(&token(&record), &timed_out())
            .await
            .unwrap()
            .unwrap()
            .record
    }
}

/// The row a registration inserted; `None` when the key already existed.
fn inserted(registration: Registration) -> Option<OperationRecord> {
    match registration {
        Registration::Inserted(record) => Some(record),
        _ => None,
    }
}

type Who = (ActorKind, String, Option<String>);

const LEASE: Duration = Duration::from_secs(30);
const HOLD: Duration = Duration::from_secs(60);

fn code(text: &str) -> ErrorCode {
    ErrorCode::parse_optional(text).unwrap().unwrap()
}

fn external_id(text: &str) -> ExternalId {
    ExternalId::parse_optional(text).unwrap().unwrap()
}

fn ns() -> Namespace {
    Namespace::parse("").unwrap()
}

fn new_operation(key: &str, lease: Duration) -> NewOperation {
    NewOperation {
        namespace: ns(),
        operation_key: OperationKey::parse(key).unwrap(),
        action_type: ActionType::parse("create_payment").unwrap(),
        request_hash: RequestHash::from_hex(&"a".repeat(64)).unwrap(),
        references: BTreeMap::from([("order_id".to_owned(), "817".to_owned())]),
        lease,
        lease_id: Uuid::new_v4(),
        attempt: None,
        action_policy: serde_json::json!({}),
        trace_context: None,
    }
}

fn token(record: &OperationRecord) -> LeaseToken {
    LeaseToken {
        namespace: record.namespace.clone(),
        operation_key: record.operation_key.clone(),
        attempt: record.attempt_count,
        lease_id: record.lease_id.unwrap(),
    }
}

fn timed_out() -> Settlement {
    Settlement::Unknown {
        error_code: ErrorCode::parse_optional("timeout").unwrap(),
        first_check_after: Duration::ZERO,
    }
}

fn succeeded(id: &str) -> Settlement {
    Settlement::Succeeded {
        external_id: ExternalId::parse_optional(id).unwrap(),
        result_json: Some(format!(r#"{{"id":"{id}"}}"#)),
    }
}

fn declined() -> Settlement {
    Settlement::FailedFinal {
        error_code: ErrorCode::parse_optional("card_declined").unwrap().unwrap(),
    }
}

fn keys(records: &[OperationRecord]) -> Vec<&str> {
    records.iter().map(|r| r.operation_key.as_str()).collect()
}

fn client(reason: &str) -> Who {
    (ActorKind::Client, String::new(), Some(reason.to_owned()))
}

fn worker(name: &str, reason: &str) -> Who {
    (ActorKind::Worker, name.to_owned(), Some(reason.to_owned()))
}

// ---------------------------------------------------------------------------------------------
// Registration and leases

async fn a_second_insert_of_a_key_changes_nothing(fx: &Fixture) {
    fx.store.ping().await.unwrap();
    let new = new_operation("k", LEASE);
    let first = inserted(fx.store.register(&new).await.unwrap()).unwrap();
    assert_eq!((first.status, first.attempt_count), (Status::InProgress, 1));
    assert_eq!(first.lease_id, Some(new.lease_id));
    assert_eq!(first.references, new.references);
    assert_eq!(first.action_type.as_str(), "create_payment");
    assert_eq!(first.request_hash, new.request_hash);
    assert_eq!(first.last_actor_kind, ActorKind::Client);
    let mut again = new_operation("k", LEASE);
    again.request_hash = RequestHash::from_hex(&"b".repeat(64)).unwrap();
    assert!(inserted(fx.store.register(&again).await.unwrap()).is_none());
    let stored = fx.get("k").await;
    assert_eq!(
        OperationRecord {
            observed_at: first.observed_at,
            ..stored
        },
        first,
        "the second insert left the row as the first wrote it"
    );
    assert_eq!(
        fx.history("k").await,
        [(None, Status::InProgress, 1, false, client("registered"))]
    );
}

async fn leases_are_measured_by_the_database_clock(fx: &Fixture) {
    // Every time of one statement comes from one reading of the database clock.
    let record = fx.register("k", LEASE).await;
    assert_eq!(record.created_at, record.observed_at);
    assert_eq!(record.updated_at, record.observed_at);
    assert_eq!(
        record.lease_until.unwrap() - record.observed_at,
        chrono::Duration::seconds(30)
    );
    let renewed = fx
        .store
        .renew(&token(&record), Duration::from_secs(90))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        renewed.lease_until.unwrap() - renewed.observed_at,
        chrono::Duration::seconds(90)
    );
    assert!(renewed.observed_at >= record.observed_at);
    assert_eq!(renewed.attempt_count, 1, "a renewal is not a new attempt");
}

async fn a_lease_ends_by_the_database_clock_and_fences_its_holder(fx: &Fixture) {
    let ns = ns();
    let live = fx.register("live", LEASE).await;
    let short = fx.register("short", Duration::from_millis(200)).await;
    // A live lease is neither taken over nor resolved.
    assert!(
        fx.store
            .claim(&Claim {
                namespace: ns.clone(),
                operation_key: live.operation_key.clone(),
                expected_status: Status::InProgress,
                expected_attempt: 1,
                lease: LEASE,
                lease_id: Uuid::new_v4(),
                attempt: None,
            })
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        fx.store
            .resolve(
                &live,
                &Resolution::ReleaseForRetry,
                &Attribution::worker("w", "x"),
                Lookup::NotMade
            )
            .await
            .unwrap()
            .is_none()
    );
    fx.clock.advance(Duration::from_millis(600));
    let ended = fx.get("short").await;
    assert!(ended.lease_until.unwrap() <= ended.observed_at);
    // An ended lease can be neither renewed nor kept, and may be taken over once.
    assert!(
        fx.store
            .renew(&token(&short), LEASE)
            .await
            .unwrap()
            .is_none()
    );
    let next_id = Uuid::new_v4();
    let taken = fx
        .store
        .claim(&Claim {
            namespace: ns.clone(),
            operation_key: short.operation_key.clone(),
            expected_status: Status::InProgress,
            expected_attempt: 1,
            lease: LEASE,
            lease_id: next_id,
            attempt: None,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((taken.attempt_count, taken.lease_id), (2, Some(next_id)));
    // The first holder's late report is refused: a later attempt exists.
    assert!(
        fx.store
            .settle(&token(&short), &succeeded("pay_1"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        fx.history("short").await[1],
        (
            Some(Status::InProgress),
            Status::InProgress,
            2,
            false,
            client("reclaimed_with_same_key")
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Compare-and-set

async fn claims_and_resolutions_apply_only_to_the_attempt_that_was_read(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let (ns, key) = (read.namespace.clone(), read.operation_key.clone());

    // A claim of `unknown` at `attempt`, with a fresh lease id.
    let claim_at = |attempt: i32| Claim {
        namespace: ns.clone(),
        operation_key: key.clone(),
        expected_status: Status::Unknown,
        expected_attempt: attempt,
        lease: LEASE,
        lease_id: Uuid::new_v4(),
        attempt: None,
    };
    // A stale attempt claims nothing.
    assert!(fx.store.claim(&claim_at(7)).await.unwrap().is_none());
    // The right one does, once.
    let claimed = fx.store.claim(&claim_at(1)).await.unwrap().unwrap();
    assert_eq!(claimed.attempt_count, 2);
    assert!(fx.store.claim(&claim_at(1)).await.unwrap().is_none());

    // Back to unknown at attempt 2: a resolution computed from attempt 1 must not apply.
    fx.store
        .settle(&token(&claimed), &timed_out())
        .await
        .unwrap()
        .unwrap();
    let found = Attribution::worker("w", "found_succeeded");
    let resolution = Resolution::Succeeded {
        external_id: Some(external_id("pay_1")),
        result_json: None,
    };
    assert!(
        fx.store
            .resolve(&read, &resolution, &found, Lookup::Made)
            .await
            .unwrap()
            .is_none()
    );
    let current = fx.get("k").await;
    assert_eq!(
        (current.status, current.attempt_count),
        (Status::Unknown, 2)
    );
    let settled = fx
        .store
        .resolve(&current, &resolution, &found, Lookup::Made)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(settled.status, Status::Succeeded);
    assert_eq!(settled.external_id.as_deref(), Some("pay_1"));
    assert_eq!(settled.reconcile_attempts, 1);
}

async fn concurrent_claims_of_one_attempt_grant_one_lease(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        let (ns, key) = (read.namespace.clone(), read.operation_key.clone());
        tasks.push(tokio::spawn(async move {
            store
                .claim(&Claim {
                    namespace: ns.clone(),
                    operation_key: key.clone(),
                    expected_status: Status::Unknown,
                    expected_attempt: 1,
                    lease: LEASE,
                    lease_id: Uuid::new_v4(),
                    attempt: None,
                })
                .await
                .unwrap()
        }));
    }
    let mut granted = Vec::new();
    for task in tasks {
        granted.extend(task.await.unwrap());
    }
    assert_eq!(granted.len(), 1, "exactly one claim wins");
    let row = fx.get("k").await;
    assert_eq!((row.attempt_count, row.lease_id), (2, granted[0].lease_id));
    assert_eq!(fx.history("k").await.len(), 3);
}

async fn concurrent_reports_of_one_lease_apply_once(fx: &Fixture) {
    let record = fx.register("k", LEASE).await;
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        let token = token(&record);
        let report = if i % 4 < 2 {
            succeeded("pay_1")
        } else {
            declined()
        };
        tasks.push(tokio::spawn(async move {
            store.settle(&token, &report).await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for task in tasks {
        applied.extend(task.await.unwrap());
    }
    assert_eq!(applied.len(), 1, "a lease holder's report applies once");
    let row = fx.get("k").await;
    assert_eq!(row.status, applied[0].record.status);
    assert!(row.status.is_terminal());
    assert_eq!(fx.history("k").await.len(), 2);
}

async fn a_holder_reports_once_even_after_the_sweep(fx: &Fixture) {
    // Reported unknown: the same holder cannot report again.
    let reported = fx.register("reported", LEASE).await;
    fx.store
        .settle(&token(&reported), &timed_out())
        .await
        .unwrap()
        .unwrap();
    assert!(
        fx.store
            .settle(&token(&reported), &succeeded("pay_1"))
            .await
            .unwrap()
            .is_none()
    );
    // Swept into unknown without a report: the holder's late report still lands.
    let silent = fx.register("silent", Duration::from_millis(100)).await;
    fx.clock.advance(Duration::from_millis(400));
    assert_eq!(fx.store.sweep_expired_leases(10, "w").await.unwrap(), 1);
    let late = fx
        .store
        .settle(&token(&silent), &succeeded("pay_2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late.record.status, Status::Succeeded);
    assert_eq!(late.record.external_id.as_deref(), Some("pay_2"));
    // A token of another lease id is refused.
    let other = fx.register("other", LEASE).await;
    let forged = LeaseToken {
        lease_id: Uuid::new_v4(),
        ..token(&other)
    };
    assert!(
        fx.store
            .settle(&forged, &succeeded("pay_3"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(fx.get("other").await.status, Status::InProgress);
}

async fn concurrent_resolutions_of_one_read_apply_once(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        let read = read.clone();
        tasks.push(tokio::spawn(async move {
            let resolution = if i % 3 == 0 {
                Resolution::ReleaseForRetry
            } else {
                Resolution::Succeeded {
                    external_id: Some(external_id(&format!("pay_{i}"))),
                    result_json: None,
                }
            };
            store
                .resolve(
                    &read,
                    &resolution,
                    &Attribution::worker(format!("w{i}"), "found"),
                    Lookup::Made,
                )
                .await
                .unwrap()
        }));
    }
    let mut applied = Vec::new();
    for task in tasks {
        applied.extend(task.await.unwrap());
    }
    assert_eq!(applied.len(), 1);
    assert_eq!(fx.get("k").await.status, applied[0].status);
    assert_eq!(fx.history("k").await.len(), 3);
}

// ---------------------------------------------------------------------------------------------
// The database's own guarantees

async fn terminal_rows_and_the_history_cannot_be_rewritten(fx: &Fixture) {
    let read = fx.unknown("k").await;
    fx.store
        .resolve(
            &read,
            &Resolution::FailedFinal {
                error_code: code("card_declined"),
            },
            &Attribution::worker("w", "found_failed"),
            Lookup::Made,
        )
        .await
        .unwrap()
        .unwrap();
    fx.unknown("open").await;
    for sql in [
        "UPDATE agent_operations SET status = 'succeeded' WHERE operation_key = 'k'",
        "UPDATE agent_operations SET error_code = 'other' WHERE operation_key = 'k'",
        "UPDATE agent_operations SET external_id = 'pay_9' WHERE operation_key = 'k'",
        "UPDATE agent_operations SET result_json = '{}' WHERE operation_key = 'k'",
        "UPDATE agent_operations SET request_hash = 'bb' WHERE operation_key = 'k'",
        "UPDATE operation_events SET reason = 'rewritten'",
        "UPDATE agent_operations SET status = 'done' WHERE operation_key = 'open'",
        "UPDATE agent_operations SET status = 'in_progress' WHERE operation_key = 'open'",
        "UPDATE agent_operations SET last_actor_kind = 'robot' WHERE operation_key = 'open'",
        "UPDATE agent_operations SET review_required_at = updated_at, status = 'pending' \
         WHERE operation_key = 'open'",
    ] {
        assert!(fx.execute_both(sql).await.is_err(), "{sql}");
    }
    let row = fx.get("k").await;
    assert_eq!(
        (row.status, row.error_code.as_deref()),
        (Status::FailedFinal, Some("card_declined"))
    );
    assert_eq!(fx.history("k").await.len(), 3);
}

async fn every_transition_is_in_the_history_with_its_actor(fx: &Fixture) {
    let read = fx.unknown("k").await;
    // A lookup that learns nothing changes no status, but what it saw is history: one entry
    // per new reason, none for the same answer again.
    let kept = fx
        .resolved(
            &read,
            &Resolution::KeepUnknown {
                next_check_after: Duration::from_secs(5),
            },
            &Attribution::worker("w1", "not_found_yet"),
            Lookup::Made,
        )
        .await;
    assert_eq!(kept.reconcile_attempts, 1);
    assert_eq!(
        kept.next_check_at.unwrap() - kept.observed_at,
        chrono::Duration::seconds(5)
    );
    let kept = fx
        .resolved(
            &kept,
            &Resolution::KeepUnknown {
                next_check_after: Duration::from_secs(5),
            },
            &Attribution::worker("w1", "not_found_yet"),
            Lookup::Made,
        )
        .await;
    assert_eq!(kept.reconcile_attempts, 2);
    let escalated = escalate_as(fx, &kept, EscalationReason::UnresolvedAfterDeadline, "w2").await;
    assert_eq!(escalated.review_required_at, Some(escalated.observed_at));
    assert_eq!(
        escalated.review_reason.as_deref(),
        Some("unresolved_after_deadline")
    );
    assert_eq!(escalated.next_check_at, None);
    let reviewer = Attribution {
        kind: ActorKind::Reviewer,
        actor: "alice".into(),
        reason: Some("confirmed in the provider's dashboard".into()),
    };
    let resolved = fx
        .resolved(
            &escalated,
            &Resolution::Succeeded {
                external_id: Some(external_id("pay_1")),
                result_json: Some(r#"{"id":"pay_1"}"#.into()),
            },
            &reviewer,
            Lookup::NotMade,
        )
        .await;
    assert_eq!(resolved.review_required_at, None);
    assert_eq!(resolved.last_actor_kind, ActorKind::Reviewer);
    let history = fx.history("k").await;
    assert_eq!(
        history,
        [
            (None, Status::InProgress, 1, false, client("registered")),
            (
                Some(Status::InProgress),
                Status::Unknown,
                1,
                false,
                client("timeout")
            ),
            (
                Some(Status::Unknown),
                Status::Unknown,
                1,
                false,
                worker("w1", "not_found_yet")
            ),
            (
                Some(Status::Unknown),
                Status::Unknown,
                1,
                true,
                worker("w2", "escalated")
            ),
            (
                Some(Status::Unknown),
                Status::Succeeded,
                1,
                false,
                (
                    ActorKind::Reviewer,
                    "alice".into(),
                    Some("confirmed in the provider's dashboard".into())
                )
            ),
        ]
    );
    // Pages by event id, in order, with the database's times.
    let key = OperationKey::parse("k").unwrap();
    let all = fx
        .store
        .history(&HistoryQuery {
            namespace: ns(),
            operation_key: key.clone(),
            after_event_id: 0,
            limit: 100,
        })
        .await
        .unwrap();
    assert!(all.windows(2).all(|w| w[0].event_id < w[1].event_id));
    assert!(all.windows(2).all(|w| w[0].occurred_at <= w[1].occurred_at));
    assert_eq!(all[0].occurred_at, read.created_at);
    assert_eq!(all[4].occurred_at, resolved.updated_at);
    let page = fx
        .store
        .history(&HistoryQuery {
            namespace: ns(),
            operation_key: key.clone(),
            after_event_id: all[0].event_id,
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(page, all[1..3]);
    assert!(
        fx.store
            .history(&HistoryQuery {
                namespace: ns(),
                operation_key: key.clone(),
                after_event_id: all[4].event_id,
                limit: 10
            })
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_release_for_retry_lets_the_next_begin_claim(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let released = fx
        .resolved(
            &read,
            &Resolution::ReleaseForRetry,
            &Attribution::worker("w", "proven_absent"),
            Lookup::Made,
        )
        .await;
    assert_eq!(released.status, Status::Pending);
    assert_eq!(released.error_code.as_deref(), Some("released_for_retry"));
    assert_eq!(released.lease_until, None);
    let claimed = fx
        .store
        .claim(&Claim {
            namespace: read.namespace.clone(),
            operation_key: read.operation_key.clone(),
            expected_status: Status::Pending,
            expected_attempt: 1,
            lease: LEASE,
            lease_id: Uuid::new_v4(),
            attempt: None,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (claimed.status, claimed.attempt_count),
        (Status::InProgress, 2)
    );
    assert_eq!(claimed.error_code, None);
    assert_eq!(
        fx.history("k").await[3],
        (
            Some(Status::Pending),
            Status::InProgress,
            2,
            false,
            client("claimed")
        )
    );
}

// ---------------------------------------------------------------------------------------------
// The reconcile path's claims and the sweep

async fn a_claimed_due_operation_is_hidden_from_other_claims(fx: &Fixture) {
    fx.unknown("k").await;
    let claimed = fx.store.claim_due(10, HOLD).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        claimed[0].next_check_at.unwrap() - claimed[0].observed_at,
        chrono::Duration::seconds(60)
    );
    assert!(fx.store.claim_due(10, HOLD).await.unwrap().is_empty());
    assert!(
        fx.second_store()
            .claim_due(10, HOLD)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        fx.store
            .claim_for_reconcile(&ns(), &claimed[0].operation_key, HOLD)
            .await
            .unwrap()
            .is_none()
    );
}

/// Runs `claimers` tasks, alternating between the fixture's store and a second store on the
/// same database, each calling `claim` (one batch) until a batch comes back empty; answers
/// what every one of them claimed.
async fn claimed_by_concurrent_claimers<T, F, Fut>(
    fx: &Fixture,
    claimers: usize,
    claim: F,
) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Arc<dyn JournalStore>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Vec<T>> + Send,
{
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..claimers {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        let claim = claim.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = claim(store.clone()).await;
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch);
            }
        }));
    }
    let mut claims = Vec::new();
    for task in tasks {
        claims.extend(task.await.unwrap());
    }
    claims
}

async fn two_reconcile_claimers_never_claim_one_operation_twice(fx: &Fixture) {
    for i in 0..40 {
        fx.unknown(&format!("k{i:02}")).await;
    }
    let claims = claimed_by_concurrent_claimers(fx, 8, |store| async move {
        let batch = store.claim_due(3, HOLD).await.unwrap();
        batch
            .into_iter()
            .map(|r| r.operation_key.to_string())
            .collect()
    })
    .await;
    let distinct: BTreeSet<_> = claims.iter().cloned().collect();
    assert_eq!(claims.len(), 40, "every operation claimed exactly once");
    assert_eq!(distinct.len(), 40);
}

async fn one_looker_at_a_time_on_request(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        let key = read.operation_key.clone();
        tasks.push(tokio::spawn(async move {
            store.claim_for_reconcile(&ns(), &key, HOLD).await.unwrap()
        }));
    }
    let mut granted = Vec::new();
    for task in tasks {
        granted.extend(task.await.unwrap());
    }
    assert_eq!(granted.len(), 1);
    assert!(fx.store.claim_due(10, HOLD).await.unwrap().is_empty());
    // Resolving ends the reconcile lease: the next look may start.
    fx.resolved(
        &granted[0],
        &Resolution::KeepUnknown {
            next_check_after: Duration::ZERO,
        },
        &Attribution::worker("w", "not_found_yet"),
        Lookup::Made,
    )
    .await;
    assert!(
        fx.store
            .claim_for_reconcile(&ns(), &read.operation_key, HOLD)
            .await
            .unwrap()
            .is_some()
    );
    // A live lease is not for looking up.
    let live = fx.register("live", LEASE).await;
    assert!(
        fx.store
            .claim_for_reconcile(&ns(), &live.operation_key, HOLD)
            .await
            .unwrap()
            .is_none()
    );
}

async fn the_sweep_takes_only_ended_leases(fx: &Fixture) {
    fx.register("live", Duration::from_secs(2)).await;
    let ended = fx.register("ended", Duration::from_millis(200)).await;
    fx.clock.advance(Duration::from_millis(500));
    assert_eq!(fx.store.sweep_expired_leases(10, "w").await.unwrap(), 1);
    assert_eq!(fx.store.sweep_expired_leases(10, "w").await.unwrap(), 0);
    assert_eq!(fx.get("live").await.status, Status::InProgress);
    let swept = fx.get("ended").await;
    assert_eq!(swept.status, Status::Unknown);
    assert_eq!(swept.error_code.as_deref(), Some("lease_expired"));
    assert_eq!(swept.unknown_since, ended.lease_until);
    assert_eq!(swept.lease_until, None);
    assert_eq!(swept.last_actor_kind, ActorKind::Worker);
    assert_eq!(
        fx.history("ended").await[1],
        (
            Some(Status::InProgress),
            Status::Unknown,
            1,
            false,
            worker("w", "lease_expired")
        )
    );
    // Due for a lookup at once.
    let due = fx.store.claim_due(10, HOLD).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].operation_key.as_str(), "ended");
}

async fn the_sweep_moves_at_most_a_batch(fx: &Fixture) {
    for i in 0..5 {
        fx.register(&format!("k{i}"), Duration::from_millis(100))
            .await;
    }
    fx.clock.advance(Duration::from_millis(400));
    let second = fx.second_store();
    let (a, b) = tokio::join!(
        fx.store.sweep_expired_leases(2, "w1"),
        second.sweep_expired_leases(2, "w2")
    );
    assert_eq!(a.unwrap() + b.unwrap(), 4);
    assert_eq!(fx.store.sweep_expired_leases(10, "w").await.unwrap(), 1);
    for i in 0..5 {
        // One sweep event each: no row moved twice.
        assert_eq!(fx.history(&format!("k{i}")).await.len(), 2);
    }
}

async fn an_operation_under_review_is_never_claimed(fx: &Fixture) {
    let read = fx.unknown("k").await;
    let escalated = escalate(fx, &read).await;
    assert!(escalated.review_required_at.is_some());
    let claimed = fx
        .store
        .claim(&Claim {
            namespace: read.namespace.clone(),
            operation_key: read.operation_key.clone(),
            expected_status: Status::Unknown,
            expected_attempt: 1,
            lease: LEASE,
            lease_id: Uuid::new_v4(),
            attempt: None,
        })
        .await
        .unwrap();
    assert!(claimed.is_none());
    assert!(fx.store.claim_due(10, HOLD).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Reads

async fn lists_page_newest_first_with_filters(fx: &Fixture) {
    for key in ["a", "b", "c", "d", "e", "f"] {
        let record = fx.register(key, LEASE).await;
        if key < "c" {
            fx.store
                .settle(&token(&record), &succeeded("pay_1"))
                .await
                .unwrap()
                .unwrap();
        }
    }
    let query = |status: Option<Status>, after: Option<(chrono::DateTime<chrono::Utc>, String)>| {
        ListQuery {
            namespace: ns(),
            status,
            action_type: None,
            after,
            limit: 2,
        }
    };
    let everything = fx
        .store
        .list(&ListQuery {
            limit: 100,
            ..query(None, None)
        })
        .await
        .unwrap();
    assert_eq!(everything.len(), 6);
    assert!(everything.windows(2).all(|w| {
        (w[0].created_at, w[0].operation_key.as_str())
            > (w[1].created_at, w[1].operation_key.as_str())
    }));
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = fx.store.list(&query(None, after.clone())).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.created_at, last.operation_key.to_string()));
        paged.extend(page);
    }
    assert_eq!(keys(&paged), keys(&everything));
    let done = fx
        .store
        .list(&ListQuery {
            limit: 100,
            ..query(Some(Status::Succeeded), None)
        })
        .await
        .unwrap();
    let keys: Vec<_> = done.iter().map(|r| r.operation_key.as_str()).collect();
    assert_eq!(keys.len(), 2);
    assert!(keys.contains(&"a") && keys.contains(&"b"));
    let other_action = fx
        .store
        .list(&ListQuery {
            action_type: Some(ActionType::parse("send_email").unwrap()),
            limit: 100,
            ..query(None, None)
        })
        .await
        .unwrap();
    assert!(other_action.is_empty());
    let other_namespace = fx
        .store
        .list(&ListQuery {
            namespace: Namespace::parse("tenant-b").unwrap(),
            limit: 100,
            ..query(None, None)
        })
        .await
        .unwrap();
    assert!(other_namespace.is_empty());
}

async fn the_review_queue_pages_oldest_first(fx: &Fixture) {
    for key in ["r3", "r1", "r2"] {
        let read = fx.unknown(key).await;
        escalate(fx, &read).await;
    }
    fx.unknown("not-escalated").await;
    let all = fx
        .store
        .list_review(&ReviewQuery {
            namespace: ns(),
            after: None,
            limit: 100,
            ..review_query()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert!(all.windows(2).all(|w| {
        (w[0].review_required_at, w[0].operation_key.as_str())
            < (w[1].review_required_at, w[1].operation_key.as_str())
    }));
    let first = &all[0];
    let rest = fx
        .store
        .list_review(&ReviewQuery {
            namespace: ns(),
            after: Some((
                first.review_required_at.unwrap(),
                first.operation_key.to_string(),
            )),
            limit: 100,
            ..review_query()
        })
        .await
        .unwrap();
    assert_eq!(keys(&rest), keys(&all[1..]));
    assert!(
        fx.store
            .list_review(&ReviewQuery {
                namespace: Namespace::parse("tenant-b").unwrap(),
                ..review_query()
            })
            .await
            .unwrap()
            .is_empty()
    );
}

/// The whole default namespace's review queue, no filter, first page.
fn review_query() -> ReviewQuery {
    ReviewQuery {
        namespace: ns(),
        action_type: None,
        min_age: Duration::ZERO,
        after: None,
        limit: 100,
    }
}

/// Escalates the unknown operation `read` to review.
async fn escalate(fx: &Fixture, read: &OperationRecord) -> OperationRecord {
    escalate_as(fx, read, EscalationReason::NoProviderLookup, "w").await
}

/// Escalates the unknown operation `read` to review for `reason`, as the worker `worker`.
async fn escalate_as(
    fx: &Fixture,
    read: &OperationRecord,
    reason: EscalationReason,
    worker: &str,
) -> OperationRecord {
    let escalate = Resolution::Escalate { reason };
    let by = Attribution::worker(worker, "escalated");
    let resolve = fx.store.resolve(read, &escalate, &by, Lookup::NotMade);
    resolve.await.unwrap().unwrap()
}

/// Registers `key` in `namespace` as `action`, with `references`.
async fn register_as(
    fx: &Fixture,
    namespace: &str,
    key: &str,
    action: &str,
    references: &[(&str, &str)],
) -> OperationRecord {
    let new = NewOperation {
        namespace: Namespace::parse(namespace).unwrap(),
        action_type: ActionType::parse(action).unwrap(),
        references: references
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
        ..new_operation(key, LEASE)
    };
    inserted(fx.store.register(&new).await.unwrap()).unwrap()
}

async fn the_review_queue_filters_by_action_type_and_age(fx: &Fixture) {
    let payment = fx.unknown("pay-old").await;
    escalate(fx, &payment).await;
    fx.clock.advance(Duration::from_secs(120));
    let email = register_as(fx, "", "mail-new", "send_email", &[]).await;
    let email = fx.store.settle(&token(&email), &timed_out()).await.unwrap();
    escalate(fx, &email.unwrap().record).await;
    let list = |action: Option<&str>, min_age: u64| {
        let query = ReviewQuery {
            action_type: action.map(|a| ActionType::parse(a).unwrap()),
            min_age: Duration::from_secs(min_age),
            ..review_query()
        };
        let store = fx.store.clone();
        async move {
            let rows = store.list_review(&query).await.unwrap();
            rows.iter()
                .map(|r| r.operation_key.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(None, 0).await, ["pay-old", "mail-new"]);
    assert_eq!(list(Some("send_email"), 0).await, ["mail-new"]);
    assert_eq!(list(Some("create_payment"), 0).await, ["pay-old"]);
    // Escalated at least a minute ago: only the one escalated before the clock moved.
    assert_eq!(list(None, 60).await, ["pay-old"]);
    assert_eq!(list(Some("send_email"), 60).await, Vec::<String>::new());
    assert_eq!(list(None, 3600).await, Vec::<String>::new());
}

async fn search_finds_operations_by_external_id_or_reference(fx: &Fixture) {
    let first = register_as(fx, "", "k1", "create_payment", &[("order_id", "817")]).await;
    let settled = fx.store.settle(&token(&first), &succeeded("pay_1")).await;
    assert_eq!(settled.unwrap().unwrap().record.status, Status::Succeeded);
    let refs = [("order.id", "9"), ("order_id", "818")];
    register_as(fx, "", "k2", "create_payment", &refs).await;
    register_as(
        fx,
        "tenant-b",
        "k3",
        "create_payment",
        &[("order_id", "817")],
    )
    .await;
    let search = |namespace: &str, external_id: Option<&str>, reference: Option<(&str, &str)>| {
        let query = SearchQuery {
            namespace: Namespace::parse(namespace).unwrap(),
            external_id: external_id.map(str::to_owned),
            reference: reference.map(|(n, v)| (n.to_owned(), v.to_owned())),
            limit: 10,
        };
        let store = fx.store.clone();
        async move {
            let rows = store.search(&query).await.unwrap();
            rows.iter()
                .map(|r| r.operation_key.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(search("", Some("pay_1"), None).await, ["k1"]);
    assert_eq!(search("", Some("pay_2"), None).await, Vec::<String>::new());
    assert_eq!(search("", None, Some(("order_id", "817"))).await, ["k1"]);
    assert_eq!(
        search("tenant-b", None, Some(("order_id", "817"))).await,
        ["k3"]
    );
    // A name with a dot is one member, not a path.
    assert_eq!(search("", None, Some(("order.id", "9"))).await, ["k2"]);
    assert_eq!(
        search("", None, Some(("order", "9"))).await,
        Vec::<String>::new()
    );
    assert_eq!(
        search("", None, Some(("order_id", "81"))).await,
        Vec::<String>::new()
    );
    // Both set: both must match.
    let both = search("", Some("pay_1"), Some(("order_id", "818"))).await;
    assert_eq!(both, Vec::<String>::new());
    assert_eq!(
        search("tenant-b", Some("pay_1"), None).await,
        Vec::<String>::new()
    );
}

async fn queue_stats_count_and_age_each_state_of_one_namespace(fx: &Fixture) {
    let empty = fx.store.queue_stats(&ns()).await.unwrap();
    let none = StateCount::default();
    assert_eq!(
        (empty.unknown, empty.in_progress, empty.due, empty.review),
        (none, none, none, none)
    );
    fx.register("live", LEASE).await;
    let escalated = fx.unknown("escalated").await;
    escalate(fx, &escalated).await;
    fx.clock.advance(Duration::from_secs(100));
    fx.unknown("due").await;
    let done = fx.register("done", LEASE).await;
    fx.store.settle(&token(&done), &declined()).await.unwrap();
    register_as(fx, "tenant-b", "other", "create_payment", &[]).await;
    fx.clock.advance(Duration::from_secs(10));
    let stats = fx.store.queue_stats(&ns()).await.unwrap();
    let age = |count: StateCount| (stats.observed_at - count.oldest.unwrap()).num_seconds();
    // Unknown: the escalated one and the due one; the oldest became unknown 110 s ago.
    assert_eq!(stats.unknown.count, 2);
    assert_eq!(age(stats.unknown), 110);
    // In progress: only the live lease, claimed 110 s ago (not the other namespace's).
    assert_eq!(stats.in_progress.count, 1);
    assert_eq!(age(stats.in_progress), 110);
    // Due for a lookup: only the one not under review, due for 10 s.
    assert_eq!(stats.due.count, 1);
    assert_eq!(age(stats.due), 10);
    assert_eq!(stats.review.count, 1);
    assert_eq!(age(stats.review), 110);
    let other = fx
        .store
        .queue_stats(&Namespace::parse("tenant-b").unwrap())
        .await
        .unwrap();
    assert_eq!((other.in_progress.count, other.unknown.count), (1, 0));
}

async fn the_same_request_is_found_under_other_keys(fx: &Fixture) {
    let hash = RequestHash::from_hex(&"a".repeat(64)).unwrap();
    let action = ActionType::parse("create_payment").unwrap();
    let find = |other_than: &'static str, window: Duration| {
        let store = fx.store.clone();
        let (hash, action) = (hash, action.clone());
        async move {
            store
                .find_same_request(&SameRequest {
                    namespace: ns(),
                    action_type: action.clone(),
                    request_hash: hash,
                    other_than: OperationKey::parse(other_than).unwrap(),
                    window,
                })
                .await
                .unwrap()
        }
    };
    let window = Duration::from_secs(600);
    assert_eq!(find("new", window).await, None);
    let open = fx.register("open", LEASE).await;
    assert_eq!(find("new", window).await.as_deref(), Some("open"));
    assert_eq!(find("open", window).await, None, "never the key itself");
    fx.store
        .settle(&token(&open), &declined())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        find("new", window).await,
        None,
        "a failed request is no duplicate"
    );
    let done = fx.register("done", LEASE).await;
    fx.store
        .settle(&token(&done), &succeeded("pay_1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(find("new", window).await.as_deref(), Some("done"));
    assert_eq!(
        find("new", Duration::ZERO).await,
        None,
        "outside the window"
    );
    assert_eq!(
        fx.store
            .find_same_request(&SameRequest {
                namespace: Namespace::parse("tenant-b").unwrap(),
                action_type: action.clone(),
                request_hash: hash,
                other_than: OperationKey::parse("new").unwrap(),
                window
            })
            .await
            .unwrap(),
        None
    );
    // A key registered itself is a retry, not a new intent: the same statement says so.
    fx.register("new", LEASE).await;
    assert_eq!(
        find("new", window).await,
        None,
        "a retry of an existing key"
    );
    assert_eq!(find("other", window).await.as_deref(), Some("new"));
}

// ---------------------------------------------------------------------------------------------
// Retention

async fn purge_deletes_only_terminal_operations_past_retention(fx: &Fixture) {
    let mut short = new_operation("short", LEASE);
    short.action_policy = serde_json::json!({ "retention_days": 3 });
    let short = inserted(fx.store.register(&short).await.unwrap()).unwrap();
    fx.store
        .settle(&token(&short), &succeeded("pay_1"))
        .await
        .unwrap()
        .unwrap();
    let long = fx.register("long", LEASE).await; // the default retention, 35 days
    fx.store
        .settle(&token(&long), &declined())
        .await
        .unwrap()
        .unwrap();
    fx.unknown("unknown").await;
    fx.register("in_progress", LEASE).await;
    let released = fx.unknown("pending").await;
    fx.resolved(
        &released,
        &Resolution::ReleaseForRetry,
        &Attribution::worker("w", "proven_absent"),
        Lookup::Made,
    )
    .await;
    assert_eq!(fx.store.purge(10).await.unwrap(), 0, "nothing is due yet");

    fx.age_retention(2).await;
    assert_eq!(
        fx.store.purge(10).await.unwrap(),
        0,
        "3 days have not passed"
    );
    fx.age_retention(2).await;
    assert_eq!(fx.store.purge(10).await.unwrap(), 1);
    assert!(
        fx.store
            .get(&ns(), &OperationKey::parse("short").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(fx.history("short").await.is_empty(), "the history goes too");
    fx.age_retention(40).await;
    assert_eq!(fx.store.purge(10).await.unwrap(), 1);
    assert!(fx.history("long").await.is_empty());
    // Pending, in-progress and unknown operations stay, whatever their age.
    let left = fx
        .store
        .list(&ListQuery {
            namespace: ns(),
            status: None,
            action_type: None,
            after: None,
            limit: 100,
        })
        .await
        .unwrap();
    let left: BTreeSet<_> = left.iter().map(|r| r.operation_key.to_string()).collect();
    assert_eq!(
        left,
        BTreeSet::from(["in_progress".into(), "pending".into(), "unknown".into()])
    );
    assert_eq!(fx.history("unknown").await.len(), 2);
    // A purged key is forgotten: it registers anew.
    let reborn = fx.register("short", LEASE).await;
    assert_eq!(reborn.attempt_count, 1);
    assert_eq!(fx.history("short").await.len(), 1);
}

async fn purge_takes_bounded_batches(fx: &Fixture) {
    for i in 0..5 {
        let record = fx.register(&format!("k{i}"), LEASE).await;
        fx.store
            .settle(&token(&record), &succeeded("pay_1"))
            .await
            .unwrap()
            .unwrap();
    }
    fx.age_retention(36).await;
    assert_eq!(fx.store.purge(2).await.unwrap(), 2);
    assert_eq!(fx.store.purge(2).await.unwrap(), 2);
    assert_eq!(fx.store.purge(2).await.unwrap(), 1);
    assert_eq!(fx.store.purge(2).await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// The hot path: registration and reports in one call

async fn a_registration_answers_the_existing_row_and_changes_nothing(fx: &Fixture) {
    let new = new_operation("k", LEASE);
    let Registration::Inserted(first) = fx.store.register(&new).await.unwrap() else {
        panic!("a new key is inserted");
    };
    assert_eq!((first.status, first.attempt_count), (Status::InProgress, 1));
    assert_eq!(first.lease_id, Some(new.lease_id));
    assert_eq!(
        first.lease_until.unwrap() - first.observed_at,
        chrono::Duration::seconds(30)
    );
    let mut again = new_operation("k", LEASE);
    again.request_hash = RequestHash::from_hex(&"b".repeat(64)).unwrap();
    let Registration::Existing(existing) = fx.store.register(&again).await.unwrap() else {
        panic!("an existing key answers its row");
    };
    assert_eq!(
        OperationRecord {
            observed_at: first.observed_at,
            ..existing.clone()
        },
        first,
        "the existing row as the first registration wrote it"
    );
    assert!(existing.observed_at >= first.observed_at);
    assert_eq!(
        OperationRecord {
            observed_at: existing.observed_at,
            ..fx.get("k").await
        },
        existing,
        "nothing changed"
    );
    assert_eq!(
        fx.history("k").await,
        [(None, Status::InProgress, 1, false, client("registered"))]
    );
    // The existing row is answered in whatever state it is.
    fx.store
        .settle(&token(&first), &succeeded("pay_1"))
        .await
        .unwrap()
        .unwrap();
    let Registration::Existing(done) = fx.store.register(&again).await.unwrap() else {
        panic!("an existing key answers its row");
    };
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(done.external_id.as_deref(), Some("pay_1"));
}

async fn concurrent_registrations_of_one_key_insert_once(fx: &Fixture) {
    let second = fx.second_store();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let store = if i % 2 == 0 {
            fx.store.clone()
        } else {
            second.clone()
        };
        tasks.push(tokio::spawn(async move {
            let registration = store.register(&new_operation("k", LEASE)).await.unwrap();
            // A row committed after the statement's snapshot is read again.
            let reread = match &registration {
                Registration::Raced => Some(
                    store
                        .get(&ns(), &OperationKey::parse("k").unwrap())
                        .await
                        .unwrap()
                        .expect("a raced registration finds the row"),
                ),
                _ => None,
            };
            (registration, reread)
        }));
    }
    let (mut inserted, mut seen) = (Vec::new(), Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            (Registration::Inserted(record), None) => inserted.push(record),
            (Registration::Existing(row), None) | (Registration::Raced, Some(row)) => {
                seen.push(row)
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(inserted.len(), 1, "exactly one registration inserts");
    assert_eq!(seen.len(), 29);
    for row in &seen {
        assert_eq!(
            (row.attempt_count, row.lease_id),
            (1, inserted[0].lease_id),
            "every other registration sees the one lease"
        );
    }
    assert_eq!(fx.history("k").await.len(), 1);
}

async fn a_report_answers_the_status_it_left(fx: &Fixture) {
    // From in_progress.
    let live = fx.register("live", LEASE).await;
    let Settled { record, previous } = fx
        .store
        .settle(&token(&live), &succeeded("pay_1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (previous, record.status),
        (Status::InProgress, Status::Succeeded)
    );
    assert_eq!(record.external_id.as_deref(), Some("pay_1"));
    assert_eq!(record.result_json.as_deref(), Some(r#"{"id":"pay_1"}"#));
    // Reported once: the same or another report applies no more, and changes nothing.
    for report in [succeeded("pay_1"), declined(), timed_out()] {
        assert!(
            fx.store
                .settle(&token(&live), &report)
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(fx.history("live").await.len(), 2);
    assert_eq!(fx.get("live").await.status, Status::Succeeded);

    // From unknown, where the sweep put a silent holder's operation.
    let swept = fx.register("swept", Duration::from_millis(100)).await;
    fx.clock.advance(Duration::from_millis(400));
    assert_eq!(fx.store.sweep_expired_leases(10, "w").await.unwrap(), 1);
    let Settled { record, previous } = fx
        .store
        .settle(&token(&swept), &declined())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (previous, record.status),
        (Status::Unknown, Status::FailedFinal)
    );
    assert_eq!(
        fx.history("swept").await[1..],
        [
            (
                Some(Status::InProgress),
                Status::Unknown,
                1,
                false,
                worker("w", "lease_expired")
            ),
            (
                Some(Status::Unknown),
                Status::FailedFinal,
                1,
                false,
                client("card_declined")
            ),
        ]
    );

    // From pending, where a release put it before the holder reported.
    let released = fx.unknown_by_sweep("released").await;
    fx.resolved(
        &released,
        &Resolution::ReleaseForRetry,
        &Attribution::worker("w", "proven_absent"),
        Lookup::Made,
    )
    .await;
    let Settled { record, previous } = fx
        .store
        .settle(&token(&released), &timed_out())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (previous, record.status),
        (Status::Pending, Status::Unknown)
    );
    assert_eq!(record.error_code.as_deref(), Some("timeout"));

    // Another lease's token, or a later attempt, applies nothing.
    let other = fx.register("other", LEASE).await;
    let forged = LeaseToken {
        lease_id: Uuid::new_v4(),
        ..token(&other)
    };
    let stale = LeaseToken {
        attempt: 2,
        ..token(&other)
    };
    for token in [forged, stale] {
        assert!(
            fx.store
                .settle(&token, &succeeded("pay_3"))
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(fx.get("other").await.status, Status::InProgress);
    // A missing operation too.
    let missing = LeaseToken {
        operation_key: OperationKey::parse("missing").unwrap(),
        ..token(&other)
    };
    assert!(
        fx.store
            .settle(&missing, &declined())
            .await
            .unwrap()
            .is_none()
    );
}

/// Runs `call` inside a span and lists the store methods it called, in order, as
/// the store names them in its spans.
async fn store_calls<T>(call: impl std::future::Future<Output = T>) -> (T, Vec<String>) {
    use std::sync::Mutex;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<String>>>);

    struct Method<'a>(&'a mut Option<String>);

    impl tracing::field::Visit for Method<'_> {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "opjournal.store.method" {
                *self.0 = Some(value.to_owned());
            }
        }

        fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Calls {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut method = None;
            attrs.record(&mut Method(&mut method));
            if let Some(method) = method {
                self.0.lock().unwrap().push(method);
            }
        }
    }

    let calls = Calls::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(calls.clone()));
    let output = call.instrument(tracing::info_span!("request")).await;
    let calls = calls.0.lock().unwrap().clone();
    (output, calls)
}

async fn the_hot_path_takes_one_store_call_per_request(fx: &Fixture) {
    let store = fx.store.clone();
    let policy = Arc::new(Policy::builtin());
    let journal = Journal::new(store.clone(), policy.clone(), RequestLimits::default());
    // Another replica: it granted none of the leases, so it reads the row before a report
    // that needs the operation's rules.
    let replica = Journal::new(store, policy, RequestLimits::default());
    let begin = |journal: Journal, key: &'static str| async move {
        let command = journal
            .parse_begin(
                "",
                key,
                "create_payment",
                &format!(r#"{{"key":"{key}","amount_minor":490000}}"#),
                0,
                [],
            )
            .unwrap();
        journal.begin(command).await.unwrap()
    };
    let lease = |outcome: BeginOutcome| match outcome {
        BeginOutcome::Execute { token, .. } => token.encode(),
        other => panic!("expected EXECUTE, got {other:?}"),
    };
    let result = r#"{"id":"pay_1","status":"succeeded","password":"hunter2"}"#;

    // A new key, then its retries: one statement each.
    let (first, calls) = store_calls(begin(journal.clone(), "k1")).await;
    assert_eq!(calls, ["register"]);
    let token = lease(first);
    let (again, calls) = store_calls(begin(journal.clone(), "k1")).await;
    assert!(
        matches!(again, BeginOutcome::InProgress { .. }),
        "{again:?}"
    );
    assert_eq!(calls, ["register"]);
    let (kept, calls) =
        store_calls(journal.complete(Complete::new(&token, "pay_1", result).unwrap())).await;
    assert_eq!(calls, ["settle"]);
    let kept = kept.unwrap();
    assert_eq!(kept.status, Status::Succeeded);
    let (replay, calls) = store_calls(begin(journal.clone(), "k1")).await;
    assert!(matches!(replay, BeginOutcome::Replay(_)), "{replay:?}");
    assert_eq!(calls, ["register"]);
    // A retried report: the lease is forgotten; the row answers it as before.
    let (retried, calls) =
        store_calls(journal.complete(Complete::new(&token, "pay_1", result).unwrap())).await;
    assert_eq!(calls, ["get", "settle", "get"]);
    assert_eq!(retried.unwrap().result_json, kept.result_json);

    // Failures and unknown outcomes need no read on the replica that granted the lease.
    let token = lease(begin(journal.clone(), "k2").await);
    let (failed, calls) =
        store_calls(journal.fail(Fail::new(&token, "card_declined").unwrap())).await;
    assert_eq!(failed.unwrap().status, Status::FailedFinal);
    assert_eq!(calls, ["settle"]);
    let token = lease(begin(journal.clone(), "k3").await);
    let (unknown, calls) =
        store_calls(journal.report_unknown(ReportUnknown::new(&token, "timeout").unwrap())).await;
    assert_eq!(unknown.unwrap().status, Status::Unknown);
    assert_eq!(calls, ["settle"]);

    // On another replica a result is sanitized by the rules read from the row, the same way.
    let token = lease(begin(journal.clone(), "k4").await);
    let (elsewhere, calls) =
        store_calls(replica.complete(Complete::new(&token, "pay_1", result).unwrap())).await;
    assert_eq!(calls, ["get", "settle"]);
    assert_eq!(elsewhere.unwrap().result_json, kept.result_json);
    let token = lease(begin(journal.clone(), "k5").await);
    let (elsewhere, calls) =
        store_calls(replica.report_unknown(ReportUnknown::new(&token, "").unwrap())).await;
    assert_eq!(calls, ["get", "settle"]);
    assert_eq!(elsewhere.unwrap().status, Status::Unknown);
    // Without a result, no rules are needed anywhere.
    let token = lease(begin(journal.clone(), "k6").await);
    let (elsewhere, calls) =
        store_calls(replica.complete(Complete::new(&token, "pay_6", "").unwrap())).await;
    assert_eq!(calls, ["settle"]);
    assert_eq!(elsewhere.unwrap().result_json, None);
    assert_eq!(fx.history("k6").await.len(), 2);

    // What was kept belongs to the whole token: the same lease id under another key is
    // read (and not found).
    let token = lease(begin(journal.clone(), "k7").await);
    let mut other = LeaseToken::parse(&token).unwrap();
    other.operation_key = OperationKey::parse("k7-other").unwrap();
    let (missing, calls) =
        store_calls(journal.complete(Complete::new(&other.encode(), "pay_7", result).unwrap()))
            .await;
    assert_eq!(calls, ["get"]);
    let missing = opjournal::api::status::journal_status(missing.unwrap_err());
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // A renewal keeps the lease's rules until the renewed end.
    let command = journal
        .parse_begin("", "k8", "create_payment", r#"{"key":"k8"}"#, 1, [])
        .unwrap();
    let token = lease(journal.begin(command).await.unwrap());
    journal
        .renew(Renew::new(&token, 30).unwrap())
        .await
        .unwrap();
    fx.clock.advance(Duration::from_millis(1300));
    let (renewed, calls) =
        store_calls(journal.complete(Complete::new(&token, "pay_8", result).unwrap())).await;
    assert_eq!(calls, ["settle"]);
    assert_eq!(renewed.unwrap().result_json, kept.result_json);
}

/// Asserts that each of `reports` was refused with `code` and the `ErrorInfo` reason
/// `expected`.
fn assert_refused<T: std::fmt::Debug>(
    reports: impl IntoIterator<Item = Result<T, opjournal::domain::error::JournalError>>,
    code: tonic::Code,
    expected: &str,
) {
    use tonic_types::StatusExt as _;
    for report in reports {
        let status = opjournal::api::status::journal_status(report.unwrap_err());
        let reason = status.get_details_error_info().map(|info| info.reason);
        assert_eq!((status.code(), reason.as_deref()), (code, Some(expected)));
    }
}

async fn reports_answer_as_before_whatever_the_lease_state(fx: &Fixture) {
    use tonic_types::StatusExt as _;
    let policy = Arc::new(Policy::builtin());
    let journal = Journal::new(fx.store.clone(), policy.clone(), RequestLimits::default());
    let replica = Journal::new(fx.store.clone(), policy, RequestLimits::default());
    let begin = |journal: Journal, key: &'static str, lease_seconds: i32| async move {
        let command = journal
            .parse_begin(
                "",
                key,
                "create_payment",
                r#"{"amount_minor":1}"#,
                lease_seconds,
                [],
            )
            .unwrap();
        match journal.begin(command).await.unwrap() {
            BeginOutcome::Execute { token, .. } => token,
            other => panic!("expected EXECUTE, got {other:?}"),
        }
    };
    let reason = |error: opjournal::domain::error::JournalError| {
        let status = opjournal::api::status::journal_status(error);
        let reason = status.get_details_error_info().map(|info| info.reason);
        (status.code(), reason.unwrap_or_default())
    };
    let result = r#"{"id":"pay_1"}"#;
    // The worker moved the operation to unknown while its holder was still working (as the
    // sweep does once the lease ends): the holder's report still lands, from unknown, on the
    // replica that granted the lease and on another.
    for (key, reporter) in [("kept", &journal), ("elsewhere", &replica)] {
        let token = begin(journal.clone(), key, 0).await.encode();
        fx.execute(
            &format!(
                "UPDATE agent_operations SET status = 'unknown', lease_until = NULL, \
                     unknown_since = now(), next_check_at = now(), \
                     error_code = 'lease_expired', last_actor_kind = 'worker', \
                     last_actor = 'w', last_reason = 'lease_expired' \
                 WHERE operation_key = '{key}'"
            ),
            &format!(
                "UPDATE agent_operations SET status = 'unknown', lease_until = NULL, \
                     unknown_since = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), \
                     next_check_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), \
                     error_code = 'lease_expired', last_actor_kind = 'worker', \
                     last_actor = 'w', last_reason = 'lease_expired' \
                 WHERE operation_key = '{key}'"
            ),
        )
        .await
        .unwrap();
        let done = reporter
            .complete(Complete::new(&token, "pay_1", result).unwrap())
            .await
            .unwrap();
        assert_eq!(done.status, Status::Succeeded);
        assert_eq!(done.result_json.as_deref(), Some(result));
        assert_eq!(
            fx.history(key).await[1..],
            [
                (
                    Some(Status::InProgress),
                    Status::Unknown,
                    1,
                    false,
                    worker("w", "lease_expired")
                ),
                (
                    Some(Status::Unknown),
                    Status::Succeeded,
                    1,
                    false,
                    client("completed")
                ),
            ]
        );
        // The same report again is answered from the row; another outcome is refused.
        let again = reporter
            .complete(Complete::new(&token, "pay_1", result).unwrap())
            .await
            .unwrap();
        assert_eq!(again.updated_at, done.updated_at);
        assert_refused(
            [
                reporter
                    .fail(Fail::new(&token, "card_declined").unwrap())
                    .await,
                reporter
                    .report_unknown(ReportUnknown::new(&token, "").unwrap())
                    .await,
                reporter
                    .complete(Complete::new(&token, "pay_2", result).unwrap())
                    .await,
            ],
            tonic::Code::FailedPrecondition,
            "OUTCOME_ALREADY_RECORDED",
        );
        assert_eq!(fx.history(key).await.len(), 3);
    }
    // A lease taken over after it ended is lost to its first holder, kept or not.
    let first = begin(journal.clone(), "taken", 1).await;
    fx.clock.advance(Duration::from_millis(1300));
    let taken_by = fx
        .store
        .claim(&Claim {
            namespace: ns(),
            operation_key: OperationKey::parse("taken").unwrap(),
            expected_status: Status::InProgress,
            expected_attempt: 1,
            lease: LEASE,
            lease_id: Uuid::new_v4(),
            attempt: None,
        })
        .await
        .unwrap()
        .unwrap();
    let taken_by = token(&taken_by);
    assert_eq!(taken_by.attempt, 2);
    assert_refused(
        [
            journal
                .complete(Complete::new(&first.encode(), "pay_1", result).unwrap())
                .await,
            journal
                .fail(Fail::new(&first.encode(), "card_declined").unwrap())
                .await,
            replica
                .report_unknown(ReportUnknown::new(&first.encode(), "").unwrap())
                .await,
        ],
        tonic::Code::Aborted,
        "LEASE_LOST",
    );
    // A token whose operation is missing: not found, whatever the result.
    let missing = LeaseToken {
        operation_key: OperationKey::parse("missing").unwrap(),
        ..taken_by.clone()
    };
    let too_deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    assert_refused(
        [
            journal
                .complete(Complete::new(&missing.encode(), "pay_1", result).unwrap())
                .await,
            journal
                .complete(Complete::new(&missing.encode(), "", "").unwrap())
                .await,
            journal
                .fail(Fail::new(&missing.encode(), "card_declined").unwrap())
                .await,
            journal
                .report_unknown(ReportUnknown::new(&missing.encode(), "").unwrap())
                .await,
        ],
        tonic::Code::NotFound,
        "OPERATION_NOT_FOUND",
    );
    assert_eq!(
        reason(
            journal
                .complete(Complete::new(&missing.encode(), "", &too_deep).unwrap())
                .await
                .unwrap_err()
        )
        .0,
        tonic::Code::InvalidArgument,
        "a malformed result is refused before anything is read"
    );
    assert_eq!(fx.get("taken").await.status, Status::InProgress);
}

// ---------------------------------------------------------------------------------------------
// Through the journal

async fn fifty_concurrent_begins_of_one_new_key_execute_once(fx: &Fixture) {
    let journal = Journal::new(
        fx.store.clone(),
        Arc::new(Policy::builtin()),
        RequestLimits::default(),
    );
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let journal = journal.clone();
        tasks.push(tokio::spawn(async move {
            let command = journal
                .parse_begin(
                    "",
                    "payment:order-817:intent-01",
                    "create_payment",
                    r#"{"order_id":"817","amount_minor":490000,"currency":"RUB"}"#,
                    0,
                    [],
                )
                .unwrap();
            journal.begin(command).await.expect("no Begin may fail")
        }));
    }
    let (mut execute, mut in_progress) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            BeginOutcome::Execute { record, token } => {
                execute += 1;
                assert_eq!(token.attempt, 1);
                assert_eq!(record.lease_id, Some(token.lease_id));
            }
            BeginOutcome::InProgress { retry_after, .. } => {
                in_progress += 1;
                assert!(retry_after > Duration::ZERO);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!((execute, in_progress), (1, 49));
    let rows: i64 = on_pool!(&fx.db, |pool| {
        sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations WHERE operation_key = $1")
            .bind("payment:order-817:intent-01")
            .fetch_one(pool)
            .await
            .unwrap()
    });
    assert_eq!(rows, 1);
    let record = fx.get("payment:order-817:intent-01").await;
    assert_eq!(
        (record.status, record.attempt_count),
        (Status::InProgress, 1)
    );
    assert_eq!(fx.history("payment:order-817:intent-01").await.len(), 1);
}

async fn migrations_apply_again_without_change(fx: &Fixture) {
    fx.register("k", LEASE).await;
    fx.db.database().migrate().await.unwrap();
    fx.db.database().migrate().await.unwrap();
    assert_eq!(fx.get("k").await.status, Status::InProgress);
}

/// Instantiates every case once per backend.
async fn backlog_stats_count_unknown_and_review_and_age_the_oldest(f: &Fixture) {
    let empty = f.store.backlog_stats().await.unwrap();
    assert_eq!(
        (empty.unknown, empty.review_queue, empty.oldest_unknown_age),
        (0, 0, None)
    );
    let old = f.unknown("old").await;
    f.execute(
        "UPDATE agent_operations SET unknown_since = now() - interval '100 seconds' \
         WHERE operation_key = 'old'",
        "UPDATE agent_operations \
         SET unknown_since = strftime('%Y-%m-%dT%H:%M:%fZ', unknown_since, '-100 seconds') \
         WHERE operation_key = 'old'",
    )
    .await
    .unwrap();
    let recent = f.unknown("recent").await;
    escalate(f, &recent).await;
    // Neither a live lease nor a terminal operation is backlog.
    f.register("live", LEASE).await;
    let stats = f.store.backlog_stats().await.unwrap();
    assert_eq!((stats.unknown, stats.review_queue), (2, 1));
    let age = stats.oldest_unknown_age.unwrap();
    assert!(age >= Duration::from_secs(100), "{age:?}");
    assert!(age < Duration::from_secs(3600), "{age:?}");
    assert_eq!(old.status, Status::Unknown);
}

/// The deadline gauges: unknown operations past their recorded policy's
/// `unknown_after_seconds` and not yet in review, by how far; and how long the review queue's
/// longest waiter has waited.
async fn backlog_stats_find_operations_past_their_deadline_and_the_longest_review_wait(
    f: &Fixture,
) {
    let empty = f.store.backlog_stats().await.unwrap();
    assert_eq!(
        (empty.overdue, empty.most_overdue, empty.oldest_review_age),
        (0, None, None)
    );
    let under =
        |deadline: serde_json::Value| serde_json::json!({ "unknown_after_seconds": deadline });
    for (key, policy, unknown_for) in [
        ("overdue-40", under(60.into()), 100),
        ("overdue-400", under(600.into()), 1000),
        ("in-time", under(600.into()), 100),
        ("no-deadline", serde_json::json!({}), 5000),
        ("null-deadline", under(serde_json::Value::Null), 5000),
        ("in-review", under(60.into()), 9000),
    ] {
        let mut new = new_operation(key, LEASE);
        new.action_policy = policy;
        let record = inserted(f.store.register(&new).await.unwrap()).unwrap();
        f.store
            .settle(&token(&record), &timed_out())
            .await
            .unwrap()
            .unwrap();
        f.execute(
            &format!(
                "UPDATE agent_operations \
                 SET unknown_since = now() - interval '{unknown_for} seconds' \
                 WHERE operation_key = '{key}'"
            ),
            &format!(
                "UPDATE agent_operations SET unknown_since = \
                 strftime('%Y-%m-%dT%H:%M:%fZ', unknown_since, '-{unknown_for} seconds') \
                 WHERE operation_key = '{key}'"
            ),
        )
        .await
        .unwrap();
    }
    // Past its deadline too, but a reviewer has it: counted by the review gauges instead.
    let in_review = f.get("in-review").await;
    escalate_as(
        f,
        &in_review,
        EscalationReason::UnresolvedAfterDeadline,
        "w",
    )
    .await;
    f.execute(
        "UPDATE agent_operations SET review_required_at = now() - interval '50 seconds' \
         WHERE operation_key = 'in-review'",
        "UPDATE agent_operations SET review_required_at = \
         strftime('%Y-%m-%dT%H:%M:%fZ', review_required_at, '-50 seconds') \
         WHERE operation_key = 'in-review'",
    )
    .await
    .unwrap();

    let stats = f.store.backlog_stats().await.unwrap();
    assert_eq!(
        (stats.unknown, stats.review_queue, stats.overdue),
        (6, 1, 2)
    );
    let most = stats.most_overdue.unwrap();
    assert!(most >= Duration::from_secs(400), "{most:?}");
    assert!(most < Duration::from_secs(500), "{most:?}");
    let waited = stats.oldest_review_age.unwrap();
    assert!(waited >= Duration::from_secs(50), "{waited:?}");
    assert!(waited < Duration::from_secs(3600), "{waited:?}");
}

async fn the_registering_trace_context_is_kept_in_its_w3c_form_only(f: &Fixture) {
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut new = new_operation("traced", LEASE);
    new.trace_context = Some(traceparent.to_owned());
    let record = inserted(f.store.register(&new).await.unwrap()).unwrap();
    assert_eq!(record.trace_context.as_deref(), Some(traceparent));
    assert_eq!(
        f.get("traced").await.trace_context.as_deref(),
        Some(traceparent)
    );
    assert_eq!(f.register("untraced", LEASE).await.trace_context, None);
    // Anything else in the column is refused by the database itself.
    for bad in [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-payment:order-817:intent-01xxxxxxxx-00f067aa0ba902b7-01",
    ] {
        let sql = format!(
            "UPDATE agent_operations SET trace_context = '{bad}' WHERE operation_key = 'untraced'"
        );
        assert!(f.execute_both(&sql).await.is_err(), "{bad} was stored");
    }
}

// ---------------------------------------------------------------------------------------------
// Attempt ids: a repeated Begin gets its live lease again

fn attempt_id(text: &str) -> AttemptId {
    AttemptId::parse_optional(text).unwrap().unwrap()
}

async fn a_lease_keeps_the_digest_of_the_attempt_id_it_was_granted_to(fx: &Fixture) {
    let (first, second) = (
        attempt_id("0f8fad5b-d9cb-469f-a165-70867728950e").digest(),
        attempt_id("7c9e6679-7425-40de-944b-e07fc1f90ae7").digest(),
    );
    let new = NewOperation {
        attempt: Some(first),
        ..new_operation("k", Duration::from_secs(5))
    };
    let registered = inserted(fx.store.register(&new).await.unwrap()).unwrap();
    assert_eq!(registered.lease_attempt, Some(first));
    assert_eq!(fx.get("k").await.lease_attempt, Some(first));
    let renewed = fx
        .store
        .renew(&token(&registered), Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.lease_attempt, Some(first), "a renewal keeps it");
    // Every claim replaces it: with the claiming Begin's digest, or with none.
    let mut expected_attempt = 1;
    for granted_to in [Some(second), None] {
        fx.clock.advance(Duration::from_secs(30));
        let claim = Claim {
            namespace: ns(),
            operation_key: OperationKey::parse("k").unwrap(),
            expected_status: Status::InProgress,
            expected_attempt,
            lease: Duration::from_secs(5),
            lease_id: Uuid::new_v4(),
            attempt: granted_to,
        };
        let claimed = fx.store.claim(&claim).await.unwrap().unwrap();
        expected_attempt += 1;
        assert_eq!(
            (claimed.attempt_count, claimed.lease_attempt),
            (expected_attempt, granted_to)
        );
    }
    // Only a lowercase SHA-256 in hex is ever stored.
    for bad in [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        &"A".repeat(64),
        &"a".repeat(63),
    ] {
        let sql = format!(
            "UPDATE agent_operations SET lease_attempt_sha256 = '{bad}' WHERE operation_key = 'k'"
        );
        assert!(fx.execute_both(&sql).await.is_err(), "{bad} was stored");
    }
}

async fn a_repeated_begin_of_one_attempt_gets_its_live_lease_again(fx: &Fixture) {
    let journal = Journal::new(
        fx.store.clone(),
        Arc::new(Policy::builtin()),
        RequestLimits::default(),
    );
    let key = "payment:order-818:intent-01";
    let begin = |attempt: Option<&str>| {
        let journal = journal.clone();
        let attempt = attempt.map(attempt_id);
        async move {
            let command = journal
                .parse_begin(
                    "",
                    key,
                    "create_payment",
                    r#"{"order_id":"818","amount_minor":490000,"currency":"RUB"}"#,
                    0,
                    [],
                )
                .unwrap();
            journal
                .begin(opjournal::journal::BeginCommand {
                    attempt_id: attempt,
                    ..command
                })
                .await
                .expect("no Begin may fail")
        }
    };
    let mine = "0f8fad5b-d9cb-469f-a165-70867728950e";
    // Ten copies of one Begin at once (a hedging proxy): one lease, the same token for all.
    let copies: Vec<_> = (0..10).map(|_| tokio::spawn(begin(Some(mine)))).collect();
    let mut tokens = BTreeSet::new();
    for copy in copies {
        match copy.await.unwrap() {
            BeginOutcome::Execute { record, token } => {
                assert_eq!(record.attempt_count, 1);
                tokens.insert(token.encode());
            }
            other => panic!("a copy of the granted Begin got {other:?}"),
        }
    }
    assert_eq!(tokens.len(), 1, "every copy got the one lease's token");
    let BeginOutcome::Execute { token, .. } = begin(Some(mine)).await else {
        panic!("the repeat did not get its lease again");
    };
    assert!(tokens.contains(&token.encode()));
    for other in [Some("7c9e6679-7425-40de-944b-e07fc1f90ae7"), None] {
        assert!(
            matches!(begin(other).await, BeginOutcome::InProgress { .. }),
            "{other:?}"
        );
    }
    assert_eq!(
        fx.history(key).await,
        [(None, Status::InProgress, 1, false, client("registered"))],
        "repeats are not transitions"
    );
    // Once the lease has ended, the same attempt id gets nothing back.
    fx.clock.advance(Duration::from_secs(3600));
    assert!(matches!(
        begin(Some(mine)).await,
        BeginOutcome::VerificationRequired(_)
    ));
}

// ---------------------------------------------------------------------------------------------
// The escalation outbox

impl Fixture {
    /// `key`'s escalation events with their delivery state, oldest first.
    async fn deliveries(&self, key: &str) -> Vec<OutboxEntry> {
        let key = OperationKey::parse(key).unwrap();
        self.store.deliveries(&ns(), &key).await.unwrap()
    }

    /// An unknown operation escalated to review by worker `w`.
    async fn escalated(&self, key: &str) -> OperationRecord {
        let read = self.unknown(key).await;
        let escalate = Resolution::Escalate {
            reason: EscalationReason::NoProviderLookup,
        };
        let who = Attribution::worker("w", "escalated");
        let resolve = self.store.resolve(&read, &escalate, &who, Lookup::NotMade);
        resolve.await.unwrap().unwrap()
    }
}

fn reviewer(name: &str, reason: &str) -> Attribution {
    Attribution {
        kind: ActorKind::Reviewer,
        actor: name.into(),
        reason: Some(reason.into()),
    }
}

async fn escalation_and_resolution_each_write_one_event(fx: &Fixture) {
    let read = fx.unknown("k").await;
    assert!(
        fx.deliveries("k").await.is_empty(),
        "no event before review"
    );
    let escalate = Resolution::Escalate {
        reason: EscalationReason::NoProviderLookup,
    };
    let who = Attribution::worker("w", "escalated");
    let escalated = fx.store.resolve(&read, &escalate, &who, Lookup::NotMade);
    let escalated = escalated.await.unwrap().unwrap();
    // Staying under review writes nothing: another escalation, another lookup.
    let again = fx
        .store
        .resolve(&escalated, &escalate, &who, Lookup::NotMade);
    let escalated = again.await.unwrap().unwrap();
    let keep = Resolution::KeepUnknown {
        next_check_after: Duration::ZERO,
    };
    let kept = fx.store.resolve(&escalated, &keep, &who, Lookup::Made);
    let escalated = kept.await.unwrap().unwrap();
    let events = fx.deliveries("k").await;
    assert_eq!(events.len(), 1);
    let required = &events[0];
    assert_eq!(required.event.event_type, EventType::ReviewRequired);
    assert_eq!(required.event.status, Status::Unknown);
    assert_eq!(required.event.attempt_count, 1);
    assert_eq!(required.event.reason.as_deref(), Some("no_provider_lookup"));
    assert_eq!(
        (required.event.actor_kind, required.event.actor.as_str()),
        (ActorKind::Worker, "w")
    );
    assert_eq!(required.event.references["order_id"], "817");
    assert_eq!(
        (required.state, required.attempts),
        (DeliveryState::Pending, 0)
    );
    assert_eq!(required.event.event_id.get_version_num(), 4);

    // A resolution that does not apply (a stale read) writes nothing.
    let stale = OperationRecord {
        attempt_count: 2,
        ..escalated.clone()
    };
    let resolution = Resolution::ReleaseForRetry;
    let alice = reviewer("alice", "not in the provider's log");
    let none = fx
        .store
        .resolve(&stale, &resolution, &alice, Lookup::NotMade);
    assert!(none.await.unwrap().is_none());
    assert_eq!(fx.deliveries("k").await.len(), 1);
    let released = fx
        .store
        .resolve(&escalated, &resolution, &alice, Lookup::NotMade);
    assert_eq!(released.await.unwrap().unwrap().status, Status::Pending);
    let events = fx.deliveries("k").await;
    assert_eq!(events.len(), 2);
    let resolved = &events[1].event;
    assert_eq!(resolved.event_type, EventType::ReviewResolved);
    assert_eq!(resolved.status, Status::Pending);
    assert_eq!(
        resolved.reason.as_deref(),
        Some("not in the provider's log")
    );
    assert_eq!(
        (resolved.actor_kind, resolved.actor.as_str()),
        (ActorKind::Reviewer, "alice")
    );
    assert_ne!(resolved.event_id, events[0].event.event_id);

    // A late holder's report ends a review too, and says so.
    let swept = fx.unknown_by_sweep("late").await;
    let escalate = fx.store.resolve(&swept, &escalate, &who, Lookup::NotMade);
    escalate.await.unwrap().unwrap();
    let (lease, report) = (token(&swept), succeeded("pay_1"));
    let report = fx.store.settle(&lease, &report).await.unwrap().unwrap();
    assert_eq!(report.record.status, Status::Succeeded);
    let late = fx.deliveries("late").await;
    let late: Vec<_> = late
        .iter()
        .map(|e| (e.event.event_type, e.event.status, e.event.actor_kind))
        .collect();
    assert_eq!(
        late,
        vec![
            (
                EventType::ReviewRequired,
                Status::Unknown,
                ActorKind::Worker
            ),
            (
                EventType::ReviewResolved,
                Status::Succeeded,
                ActorKind::Client
            ),
        ]
    );

    // The storage follows the domain's rule: one event per change of the review flag in the
    // history, of the type `event_for` names, in order.
    for key in ["k", "late"] {
        let flags: Vec<bool> = fx.history(key).await.iter().map(|e| e.3).collect();
        let expected: Vec<EventType> = flags
            .windows(2)
            .filter_map(|pair| event_for(pair[0], pair[1]))
            .collect();
        let written: Vec<EventType> = fx
            .deliveries(key)
            .await
            .iter()
            .map(|e| e.event.event_type)
            .collect();
        assert_eq!(written, expected, "{key}");
    }
}

async fn a_claimed_event_is_hidden_and_only_its_latest_attempt_records(fx: &Fixture) {
    fx.escalated("a").await;
    fx.escalated("b").await;
    let lease = Duration::from_secs(30);
    let stats = fx.store.outbox_stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (2, 0));
    assert!(stats.oldest_pending_age.is_some());
    let first = fx.store.claim_deliveries(10, lease).await.unwrap();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|e| e.attempts == 1));
    let second = fx.second_store();
    assert!(second.claim_deliveries(10, lease).await.unwrap().is_empty());

    // The first claim's lease ends before it records: another worker claims again.
    fx.clock.advance(lease + Duration::from_secs(1));
    let again = second.claim_deliveries(10, lease).await.unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|e| e.attempts == 2));
    let ok = DeliveryOutcome::Delivered { status_code: 204 };
    let late = fx.store.record_delivery(first[0].event.event_id, 1, &ok);
    assert!(!late.await.unwrap(), "a superseded attempt records nothing");

    let (a, b) = (again[0].event.event_id, again[1].event.event_id);
    assert!(second.record_delivery(a, 2, &ok).await.unwrap());
    let failed = DeliveryOutcome::Failed {
        status_code: Some(503),
        error: "http_503".into(),
        retry_after: Duration::from_secs(10),
    };
    assert!(second.record_delivery(b, 2, &failed).await.unwrap());
    let entries: Vec<OutboxEntry> = [fx.deliveries("a").await, fx.deliveries("b").await].concat();
    let by_id = |id| entries.iter().find(|e| e.event.event_id == id).unwrap();
    let delivered = by_id(a);
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert_eq!(delivered.last_status_code, Some(204));
    assert!(delivered.finished_at.is_some());
    let retrying = by_id(b);
    assert_eq!(retrying.state, DeliveryState::Pending);
    assert_eq!(retrying.last_status_code, Some(503));
    assert_eq!(retrying.last_error.as_deref(), Some("http_503"));
    assert!(retrying.next_attempt_at > retrying.observed_at);
    assert!(
        fx.store
            .claim_deliveries(10, lease)
            .await
            .unwrap()
            .is_empty(),
        "not due before its backoff"
    );
    let ok_again = fx.store.record_delivery(a, 2, &ok);
    assert!(
        !ok_again.await.unwrap(),
        "a delivered event stays delivered"
    );

    fx.clock.advance(Duration::from_secs(11));
    let third = fx.store.claim_deliveries(10, lease).await.unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!((third[0].event.event_id, third[0].attempts), (b, 3));
    let dead = DeliveryOutcome::Dead {
        status_code: None,
        error: "connect".into(),
    };
    assert!(fx.store.record_delivery(b, 3, &dead).await.unwrap());
    let stats = fx.store.outbox_stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 1));
    assert_eq!(stats.oldest_pending_age, None);
    assert_eq!(fx.deliveries("b").await[0].state, DeliveryState::Dead);
}

async fn two_delivery_workers_never_claim_one_event_twice(fx: &Fixture) {
    for i in 0..20 {
        fx.escalated(&format!("k{i:02}")).await;
    }
    let claims = claimed_by_concurrent_claimers(fx, 6, |store| async move {
        let batch = store.claim_deliveries(3, HOLD).await.unwrap();
        batch.into_iter().map(|e| e.event.event_id).collect()
    })
    .await;
    let distinct: BTreeSet<_> = claims.iter().copied().collect();
    assert_eq!(claims.len(), 20, "every event claimed exactly once");
    assert_eq!(distinct.len(), 20);
}

async fn purge_takes_an_operations_events_with_it(fx: &Fixture) {
    let escalated = fx.escalated("done").await;
    let declined = Resolution::FailedFinal {
        error_code: code("card_declined"),
    };
    let alice = reviewer("alice", "declined");
    let resolve = fx
        .store
        .resolve(&escalated, &declined, &alice, Lookup::NotMade);
    resolve.await.unwrap().unwrap();
    fx.escalated("waiting").await;
    assert_eq!(fx.deliveries("done").await.len(), 2);
    fx.age_retention(40).await;
    assert_eq!(fx.store.purge(10).await.unwrap(), 1);
    assert!(fx.deliveries("done").await.is_empty());
    assert_eq!(fx.deliveries("waiting").await.len(), 1, "others stay");
}

// ---------------------------------------------------------------------------------------------
// The report table: the fences of `fence_report.sql` and `fence_renew.sql`, every starting
// state against every token and every report kind

/// A row's state when a report arrives. Each is reached at attempt 2, after a first lease
/// ended and was taken over, so that the first attempt's token is a real older one.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Released for retry after the sweep; no report in this attempt.
    PendingReleased,
    InProgressLive,
    /// The lease ended and the sweep has not run yet.
    InProgressEnded,
    /// Swept: the holder has not reported.
    UnknownSwept,
    /// The holder reported an unknown outcome.
    UnknownReported,
    Succeeded,
    FailedFinal,
}

/// Whose token makes the report.
#[derive(Debug, Clone, Copy)]
enum Holder {
    /// The token of the row's current lease.
    Own,
    /// The token of the first attempt, whose lease was taken over.
    OlderAttempt,
    /// The current attempt with another lease id: a holder the store never granted this lease.
    Other,
}

/// A report kind; the columns of the table, in this order.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Complete,
    Fail,
    ReportUnknown,
    Renew,
}

const KINDS: [Kind; 4] = [Kind::Complete, Kind::Fail, Kind::ReportUnknown, Kind::Renew];

/// What the store answers: the report applies and leaves the row in this status (a renewal
/// leaves it `in_progress` with a later lease end), or it is refused (`None`, the row unchanged).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Applies(Status),
    Refused,
}

const SUCCEEDED: Answer = Answer::Applies(Status::Succeeded);
const FAILED: Answer = Answer::Applies(Status::FailedFinal);
const UNKNOWN: Answer = Answer::Applies(Status::Unknown);
const RENEWED: Answer = Answer::Applies(Status::InProgress);
const NO: Answer = Answer::Refused;

/// The documented rule, cell by cell: a report applies only with the token of the row's
/// lease, to an `in_progress` row (live lease or ended) or an `unknown` / `pending` one nothing
/// was reported on in this attempt; a terminal row never. A renewal applies only to its
/// holder's live lease. Every other token is refused everywhere.
#[rustfmt::skip]
const REPORT_TABLE: [(Start, Holder, [Answer; 4]); 21] = {
    use Holder::{OlderAttempt as Older, Other, Own};
    use Start::*;
    [
        //                         complete   fail    unknown  renew
        (PendingReleased, Own,   [SUCCEEDED, FAILED, UNKNOWN, NO]),
        (PendingReleased, Older, [NO,        NO,     NO,      NO]),
        (PendingReleased, Other, [NO,        NO,     NO,      NO]),
        (InProgressLive,  Own,   [SUCCEEDED, FAILED, UNKNOWN, RENEWED]),
        (InProgressLive,  Older, [NO,        NO,     NO,      NO]),
        (InProgressLive,  Other, [NO,        NO,     NO,      NO]),
        (InProgressEnded, Own,   [SUCCEEDED, FAILED, UNKNOWN, NO]),
        (InProgressEnded, Older, [NO,        NO,     NO,      NO]),
        (InProgressEnded, Other, [NO,        NO,     NO,      NO]),
        (UnknownSwept,    Own,   [SUCCEEDED, FAILED, UNKNOWN, NO]),
        (UnknownSwept,    Older, [NO,        NO,     NO,      NO]),
        (UnknownSwept,    Other, [NO,        NO,     NO,      NO]),
        (UnknownReported, Own,   [NO,        NO,     NO,      NO]),
        (UnknownReported, Older, [NO,        NO,     NO,      NO]),
        (UnknownReported, Other, [NO,        NO,     NO,      NO]),
        (Succeeded,       Own,   [NO,        NO,     NO,      NO]),
        (Succeeded,       Older, [NO,        NO,     NO,      NO]),
        (Succeeded,       Other, [NO,        NO,     NO,      NO]),
        (FailedFinal,     Own,   [NO,        NO,     NO,      NO]),
        (FailedFinal,     Older, [NO,        NO,     NO,      NO]),
        (FailedFinal,     Other, [NO,        NO,     NO,      NO]),
    ]
};

const ENDING: Duration = Duration::from_millis(100);
const PAST_ENDING: Duration = Duration::from_millis(400);

impl Fixture {
    /// Takes over an ended first lease of `key` with a lease of `lease`: attempt 2. Answers
    /// the first attempt's row and the second's.
    async fn second_attempt(
        &self,
        key: &str,
        lease: Duration,
    ) -> (OperationRecord, OperationRecord) {
        let first = self.register(key, ENDING).await;
        self.clock.advance(PAST_ENDING);
        let second = self
            .store
            .claim(&Claim {
                namespace: ns(),
                operation_key: first.operation_key.clone(),
                expected_status: Status::InProgress,
                expected_attempt: 1,
                lease,
                lease_id: Uuid::new_v4(),
                attempt: None,
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(second.attempt_count, 2, "{key}: the takeover");
        (first, second)
    }

    /// `key` in state `start` at attempt 2; answers the first attempt's row and the row now.
    async fn start_in(&self, key: &str, start: Start) -> (OperationRecord, OperationRecord) {
        let lease = match start {
            Start::PendingReleased | Start::InProgressEnded | Start::UnknownSwept => ENDING,
            _ => LEASE,
        };
        let (first, second) = self.second_attempt(key, lease).await;
        let own = token(&second);
        let settle = |settlement: Settlement| async move {
            self.store.settle(&own, &settlement).await.unwrap().unwrap();
        };
        match start {
            Start::InProgressLive => {}
            Start::InProgressEnded => self.clock.advance(PAST_ENDING),
            Start::UnknownSwept | Start::PendingReleased => {
                self.clock.advance(PAST_ENDING);
                // Earlier cells' rows may be swept too: they are done with.
                assert!(self.store.sweep_expired_leases(1000, "w").await.unwrap() >= 1);
            }
            Start::UnknownReported => settle(timed_out()).await,
            Start::Succeeded => settle(succeeded("pay_1")).await,
            Start::FailedFinal => settle(declined()).await,
        }
        if let Start::PendingReleased = start {
            let read = self.get(key).await;
            let attribution = Attribution::worker("w", "proven_absent");
            let released = self.store.resolve(
                &read,
                &Resolution::ReleaseForRetry,
                &attribution,
                Lookup::Made,
            );
            released.await.unwrap().unwrap();
        }
        (first, self.get(key).await)
    }
}

/// One cell: `kind` by `holder` on a row in `start`; asserts the store's answer and the row.
async fn report_cell(
    fx: &Fixture,
    key: &str,
    start: Start,
    holder: Holder,
    kind: Kind,
    expected: Answer,
) {
    let cell = format!("{start:?} × {holder:?} token × {kind:?}");
    let (older, before) = fx.start_in(key, start).await;
    let own = token(&before);
    let token = match holder {
        Holder::Own => own,
        Holder::OlderAttempt => token(&older),
        Holder::Other => LeaseToken {
            lease_id: Uuid::new_v4(),
            ..own
        },
    };
    let (token, cell_ref, before_ref) = (&token, &cell, &before);
    let settle = |settlement: Settlement| async move {
        let settled = fx.store.settle(token, &settlement).await.unwrap();
        settled.map(|s| {
            let (before, cell) = (before_ref, cell_ref);
            assert_eq!(
                s.previous, before.status,
                "{cell}: the status reported from"
            );
            s.record
        })
    };
    let answered = match kind {
        Kind::Complete => settle(succeeded("pay_2")).await,
        Kind::Fail => settle(declined()).await,
        Kind::ReportUnknown => settle(timed_out()).await,
        Kind::Renew => fx.store.renew(token, HOLD).await.unwrap(),
    };
    let after = fx.get(key).await;
    let answer = answered
        .as_ref()
        .map_or(Answer::Refused, |r| Answer::Applies(r.status));
    assert_eq!(answer, expected, "{cell}: the store's answer");
    match expected {
        Answer::Applies(status) => {
            let answered = answered.unwrap();
            assert_eq!(
                (after.status, after.attempt_count),
                (status, 2),
                "{cell}: the row after"
            );
            assert_eq!(answered.attempt_count, 2, "{cell}: the attempt answered");
            if let Kind::Renew = kind {
                assert!(
                    after.lease_until > before.lease_until,
                    "{cell}: the lease extended"
                );
            }
        }
        Answer::Refused => {
            let unchanged = OperationRecord {
                observed_at: before.observed_at,
                ..after
            };
            assert_eq!(unchanged, before, "{cell}: the row after (unchanged)");
        }
    }
}

async fn the_report_table(fx: &Fixture) {
    for (row, (start, holder, answers)) in REPORT_TABLE.into_iter().enumerate() {
        for (column, (kind, expected)) in KINDS.into_iter().zip(answers).enumerate() {
            let key = format!("report-{row}-{column}");
            report_cell(fx, &key, start, holder, kind, expected).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The resolution table: the fence of `fence_read.sql`, the status and attempt read, never a
// live lease

/// Which read a resolution is made from.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// The row as it is.
    Current,
    /// The first attempt's row, read before the takeover.
    OlderAttempt,
}

/// A resolution; the columns of the table, in this order.
const RESOLUTIONS: [&str; 3] = ["succeeded", "release_for_retry", "keep_unknown"];

fn resolution(name: &str) -> Resolution {
    match name {
        "succeeded" => Resolution::Succeeded {
            external_id: ExternalId::parse_optional("pay_1").unwrap(),
            result_json: None,
        },
        "release_for_retry" => Resolution::ReleaseForRetry,
        _ => Resolution::KeepUnknown {
            next_check_after: Duration::from_secs(60),
        },
    }
}

const PENDING: Answer = Answer::Applies(Status::Pending);

/// The documented rule: a resolution applies to the status and attempt it read, unless that
/// is a live lease; any other read is refused.
#[rustfmt::skip]
const RESOLUTION_TABLE: [(Start, Read, [Answer; 3]); 10] = {
    use Read::{Current, OlderAttempt as Older};
    use Start::*;
    [
        //                           succeeded  release  keep_unknown
        (PendingReleased, Current, [SUCCEEDED, PENDING, UNKNOWN]),
        (PendingReleased, Older,   [NO,        NO,      NO]),
        (InProgressLive,  Current, [NO,        NO,      NO]),
        (InProgressLive,  Older,   [NO,        NO,      NO]),
        (InProgressEnded, Current, [SUCCEEDED, PENDING, UNKNOWN]),
        (InProgressEnded, Older,   [NO,        NO,      NO]),
        (UnknownSwept,    Current, [SUCCEEDED, PENDING, UNKNOWN]),
        (UnknownSwept,    Older,   [NO,        NO,      NO]),
        (UnknownReported, Current, [SUCCEEDED, PENDING, UNKNOWN]),
        (UnknownReported, Older,   [NO,        NO,      NO]),
    ]
};

async fn the_resolution_table(fx: &Fixture) {
    let attribution = Attribution::worker("w", "looked_up");
    for (row, (start, read, answers)) in RESOLUTION_TABLE.into_iter().enumerate() {
        for (column, (name, expected)) in RESOLUTIONS.into_iter().zip(answers).enumerate() {
            let cell = format!("{start:?} × {read:?} read × {name}");
            let key = format!("resolve-{row}-{column}");
            let (older, before) = fx.start_in(&key, start).await;
            let expected_row = match read {
                Read::Current => &before,
                Read::OlderAttempt => &older,
            };
            let answered = fx
                .store
                .resolve(expected_row, &resolution(name), &attribution, Lookup::Made)
                .await
                .unwrap();
            let after = fx.get(&key).await;
            let answer = answered
                .as_ref()
                .map_or(Answer::Refused, |r| Answer::Applies(r.status));
            assert_eq!(answer, expected, "{cell}: the store's answer");
            match expected {
                Answer::Applies(status) => assert_eq!(
                    (after.status, after.attempt_count),
                    (status, 2),
                    "{cell}: the row after"
                ),
                Answer::Refused => assert_eq!(
                    OperationRecord {
                        observed_at: before.observed_at,
                        ..after
                    },
                    before,
                    "{cell}: the row after (unchanged)"
                ),
            }
        }
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            use super::*;
            $(
                #[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
                async fn $case(pool: PgPool) {
                    super::$case(&Fixture::postgres(pool)).await;
                }
            )*
        }

        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&Fixture::sqlite().await).await;
                }
            )*
        }
    };
}

conformance!(
    the_report_table,
    the_resolution_table,
    a_second_insert_of_a_key_changes_nothing,
    leases_are_measured_by_the_database_clock,
    a_lease_ends_by_the_database_clock_and_fences_its_holder,
    claims_and_resolutions_apply_only_to_the_attempt_that_was_read,
    concurrent_claims_of_one_attempt_grant_one_lease,
    concurrent_reports_of_one_lease_apply_once,
    a_holder_reports_once_even_after_the_sweep,
    concurrent_resolutions_of_one_read_apply_once,
    terminal_rows_and_the_history_cannot_be_rewritten,
    every_transition_is_in_the_history_with_its_actor,
    a_release_for_retry_lets_the_next_begin_claim,
    a_claimed_due_operation_is_hidden_from_other_claims,
    two_reconcile_claimers_never_claim_one_operation_twice,
    one_looker_at_a_time_on_request,
    the_sweep_takes_only_ended_leases,
    the_sweep_moves_at_most_a_batch,
    an_operation_under_review_is_never_claimed,
    lists_page_newest_first_with_filters,
    the_review_queue_pages_oldest_first,
    the_review_queue_filters_by_action_type_and_age,
    search_finds_operations_by_external_id_or_reference,
    queue_stats_count_and_age_each_state_of_one_namespace,
    the_same_request_is_found_under_other_keys,
    purge_deletes_only_terminal_operations_past_retention,
    purge_takes_bounded_batches,
    fifty_concurrent_begins_of_one_new_key_execute_once,
    migrations_apply_again_without_change,
    backlog_stats_count_unknown_and_review_and_age_the_oldest,
    backlog_stats_find_operations_past_their_deadline_and_the_longest_review_wait,
    the_registering_trace_context_is_kept_in_its_w3c_form_only,
    a_registration_answers_the_existing_row_and_changes_nothing,
    concurrent_registrations_of_one_key_insert_once,
    a_report_answers_the_status_it_left,
    the_hot_path_takes_one_store_call_per_request,
    reports_answer_as_before_whatever_the_lease_state,
    a_lease_keeps_the_digest_of_the_attempt_id_it_was_granted_to,
    a_repeated_begin_of_one_attempt_gets_its_live_lease_again,
    escalation_and_resolution_each_write_one_event,
    a_claimed_event_is_hidden_and_only_its_latest_attempt_records,
    two_delivery_workers_never_claim_one_event_twice,
    purge_takes_an_operations_events_with_it,
);

/// The backlog gauges' statement is answered from partial indexes on Postgres, so its cost
/// follows the backlog, not the journal.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_backlog_statement_uses_only_partial_indexes_on_postgres(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        opjournal::store::PgStore::new(pool.clone())
            .explained()
            .into_iter()
            .find_map(|(name, sql)| (name == "backlog_stats").then(|| sql.to_owned()))
            .unwrap()
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert!(plan.contains("agent_operations_unknown_since"), "{plan}");
    assert!(plan.contains("agent_operations_review_queue"), "{plan}");
}

/// A report racing a change of its row on Postgres: the change committed after the report's
/// snapshot is waited for, the fence is checked on the row as that change left it, and the
/// status answered is the one the report replaced.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_report_racing_a_change_of_its_row_sees_the_change_on_postgres(pool: PgPool) {
    let fx = Fixture::postgres(pool.clone());
    let swept = fx.register("swept", LEASE).await;
    let taken = fx.register("taken", LEASE).await;

    // The sweep moves `swept` to unknown in a transaction still open when the report comes.
    let mut sweep = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE agent_operations SET status = 'unknown', error_code = 'lease_expired', \
             unknown_since = lease_until, lease_until = NULL, next_check_at = now(), \
             updated_at = now(), last_actor_kind = 'worker', last_actor = 'w', \
             last_reason = 'lease_expired' \
         WHERE operation_key = 'swept'",
    )
    .execute(&mut *sweep)
    .await
    .unwrap();
    let store = fx.store.clone();
    let token_swept = token(&swept);
    let report = tokio::spawn(async move { store.settle(&token_swept, &declined()).await });
    a_statement_waits_for_a_lock(&pool).await;
    assert!(!report.is_finished(), "the report waits for the sweep");
    sweep.commit().await.unwrap();
    let Settled { record, previous } = report.await.unwrap().unwrap().unwrap();
    assert_eq!(
        (previous, record.status),
        (Status::Unknown, Status::FailedFinal)
    );
    assert_eq!(
        fx.history("swept").await[1..]
            .iter()
            .map(|e| (e.0, e.1))
            .collect::<Vec<_>>(),
        [
            (Some(Status::InProgress), Status::Unknown),
            (Some(Status::Unknown), Status::FailedFinal)
        ]
    );

    // A later attempt takes `taken` over in a transaction still open when the report comes:
    // the report no longer applies.
    let mut takeover = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE agent_operations SET attempt_count = 2, lease_id = gen_random_uuid(), \
             updated_at = now(), last_reason = 'reclaimed_with_same_key' \
         WHERE operation_key = 'taken'",
    )
    .execute(&mut *takeover)
    .await
    .unwrap();
    let store = fx.store.clone();
    let token_taken = token(&taken);
    let report = tokio::spawn(async move { store.settle(&token_taken, &succeeded("pay_1")).await });
    a_statement_waits_for_a_lock(&pool).await;
    assert!(!report.is_finished(), "the report waits for the takeover");
    takeover.commit().await.unwrap();
    assert!(report.await.unwrap().unwrap().is_none());
    let row = fx.get("taken").await;
    assert_eq!((row.status, row.attempt_count), (Status::InProgress, 2));
}

/// A registration racing a concurrent one on Postgres: the row committed after the
/// registration's snapshot is not readable by it, and it answers `Raced`; nothing is changed.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_registration_racing_another_answers_raced_on_postgres(pool: PgPool) {
    let fx = Fixture::postgres(pool.clone());
    let mut other = pool.begin().await.unwrap();
    let first = new_operation("k", LEASE);
    sqlx::query(
        "INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, \
             status, attempt_count, lease_until, lease_id, last_reason, created_at, updated_at) \
         VALUES ('default', 'k', 'create_payment', repeat('a', 64), 'in_progress', 1, \
             now() + interval '30 seconds', $1, 'registered', now(), now())",
    )
    .bind(first.lease_id)
    .execute(&mut *other)
    .await
    .unwrap();
    let store = fx.store.clone();
    let registration =
        tokio::spawn(async move { store.register(&new_operation("k", LEASE)).await });
    a_statement_waits_for_a_lock(&pool).await;
    assert!(
        !registration.is_finished(),
        "the registration waits for the other"
    );
    other.commit().await.unwrap();
    assert_eq!(registration.await.unwrap().unwrap(), Registration::Raced);
    let row = fx.get("k").await;
    assert_eq!((row.attempt_count, row.lease_id), (1, Some(first.lease_id)));
    assert_eq!(fx.history("k").await.len(), 1);
}

/// A new journal's statements are planned without statistics, when Postgres cannot tell the
/// primary key from the other indexes that lead with the namespace. Once its tables hold
/// enough changes, `analyze_new_tables` (run by the reconcile worker) gathers statistics,
/// key lookups use the primary key, and tables with statistics are left to autovacuum.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_new_journal_is_analyzed_once_it_holds_operations_on_postgres(pool: PgPool) {
    // Autovacuum must not analyze first, or this would not show who did.
    for table in ["agent_operations", "operation_events"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    // One connection: every change below is that one backend's to report.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let store = opjournal::store::postgres::PgStore::new(one.clone());
    assert_eq!(store.analyze_new_tables(200).await.unwrap(), Some(0));

    for i in 0..300 {
        let new = new_operation(&format!("analyze-{i}"), HOLD);
        assert!(inserted(store.register(&new).await.unwrap()).is_some());
    }
    // A backend reports its changes to the statistics at most once a second, when idle;
    // this makes it report them as soon as this statement ends.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&one)
        .await
        .unwrap();
    assert_eq!(store.analyze_new_tables(200).await.unwrap(), Some(2));
    assert_eq!(store.analyze_new_tables(200).await.unwrap(), None);

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        "PREPARE lookup(text, text) AS \
         SELECT * FROM agent_operations WHERE namespace = $1 AND operation_key = $2",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan: Vec<String> = sqlx::query_scalar("EXPLAIN EXECUTE lookup('default', 'analyze-7')")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("agent_operations_pkey"), "{plan}");
}

/// The console's counts read a namespace's unknown, in-progress and escalated operations
/// through the partial indexes of those states, never the namespace's terminal rows.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_queue_counts_never_read_terminal_rows_on_postgres(pool: PgPool) {
    sqlx::query(
        "INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, \
         status, attempt_count, created_at, updated_at) \
         SELECT 'shop', 'done-' || i, 'create_payment', repeat('a', 64), 'succeeded', 1, \
                now(), now() \
         FROM generate_series(1, 20000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE agent_operations")
        .execute(&pool)
        .await
        .unwrap();
    let sql = opjournal::store::PgStore::new(pool.clone())
        .explained()
        .into_iter()
        .find_map(|(name, sql)| (name == "queue_stats").then(|| sql.to_owned()))
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE queue_stats AS {sql}")))
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN (ANALYZE, BUFFERS OFF) EXECUTE queue_stats(NULL, 'shop')")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert!(!plan.contains("agent_operations_pkey"), "{plan}");
    assert!(!plan.contains("namespace_created"), "{plan}");
    for index in [
        "agent_operations_unknown_since",
        "agent_operations_in_progress_lease",
        "agent_operations_review_queue",
    ] {
        assert!(plan.contains(index), "{index} not used: {plan}");
    }
}
