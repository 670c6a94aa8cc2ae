-- The journal on SQLite: the schema of the Postgres migrations 20261130000001 to
-- 20261130000004 in one step, with the same columns, constraints, indexes and triggers, so
-- that both backends keep the same rules in the database itself.
--
-- SQLite has no timestamp type: every time is TEXT in one fixed-width form,
-- 'YYYY-MM-DDTHH:MM:SS.SSSZ' (UTC, milliseconds), written by strftime from the database
-- clock ('now') or checked against it, so that comparing the text compares the times. The
-- CHECKs below refuse any other form. UUIDs are TEXT in their hyphenated form and JSON is
-- TEXT that must be valid JSON. Tables are STRICT: a value of the wrong type is refused, not
-- converted.

-- The operation journal: the source article's agent_operations table (step 3), extended with
-- a namespace (tenant) in the primary key, fencing-token leases, business references,
-- reconcile scheduling, human review, the recorded action policy and retention.
CREATE TABLE agent_operations (
    namespace             TEXT    NOT NULL DEFAULT 'default',
    operation_key         TEXT    NOT NULL,
    action_type           TEXT    NOT NULL,
    request_hash          TEXT    NOT NULL,
    status                TEXT    NOT NULL,
    attempt_count         INTEGER NOT NULL DEFAULT 0,
    external_id           TEXT,
    result_json           TEXT,
    error_code            TEXT,
    lease_until           TEXT,
    -- Random part of the fencing token of the current (or last) lease.
    lease_id              TEXT,
    -- Business links such as {"order_id": "817"}; never hashed.
    business_references   TEXT    NOT NULL DEFAULT '{}',
    -- When the outcome became unknown: the absence grace window for lookups counts from here.
    unknown_since         TEXT,
    -- When the reconcile path next looks the operation up, and how often it has.
    next_check_at         TEXT,
    reconcile_attempts    INTEGER NOT NULL DEFAULT 0,
    created_at            TEXT    NOT NULL,
    updated_at            TEXT    NOT NULL,
    -- Human review: set when the operation waits for a reviewer.
    review_required_at    TEXT,
    review_reason         TEXT,
    -- Who made the last change and why; the history trigger copies them.
    last_actor_kind       TEXT    NOT NULL DEFAULT 'client',
    last_actor            TEXT    NOT NULL DEFAULT '',
    last_reason           TEXT,
    -- Whether the holder of the current attempt has reported an outcome (0 or 1).
    outcome_reported      INTEGER NOT NULL DEFAULT FALSE,
    -- The action policy in force when the operation was registered (JSON).
    action_policy         TEXT,
    -- When a terminal operation may be purged; set by a trigger on the terminal transition.
    purge_after           TEXT,
    -- While a worker (or ReconcileOperation) looks the operation up, nobody else may.
    reconcile_lease_until TEXT,
    PRIMARY KEY (namespace, operation_key),
    CONSTRAINT agent_operations_status_check CHECK (status IN (
        'pending',
        'in_progress',
        'unknown',
        'succeeded',
        'failed_final'
    )),
    -- The lengths the Postgres columns enforce (characters).
    CONSTRAINT agent_operations_lengths CHECK (
        length(namespace) BETWEEN 1 AND 100
        AND length(operation_key) BETWEEN 1 AND 200
        AND length(action_type) BETWEEN 1 AND 80
        AND length(external_id) <= 200
        AND length(error_code) <= 100
        AND length(review_reason) <= 100
        AND length(last_actor) <= 200
        AND length(last_reason) <= 500
    ),
    CONSTRAINT agent_operations_request_hash_hex CHECK (
        length(request_hash) = 64 AND request_hash NOT GLOB '*[^0-9a-f]*'
    ),
    -- An in_progress row always has a lease; no other row has one.
    CONSTRAINT agent_operations_in_progress_has_lease CHECK (
        (status = 'in_progress') = (lease_until IS NOT NULL)
    ),
    CONSTRAINT agent_operations_in_progress_has_lease_id CHECK (
        status <> 'in_progress' OR lease_id IS NOT NULL
    ),
    CONSTRAINT agent_operations_lease_id_uuid CHECK (
        lease_id IS NULL OR (length(lease_id) = 36 AND lease_id NOT GLOB '*[^0-9a-f-]*')
    ),
    CONSTRAINT agent_operations_attempt_count_non_negative CHECK (attempt_count >= 0),
    CONSTRAINT agent_operations_references_object CHECK (
        json_valid(business_references) AND json_type(business_references) = 'object'
    ),
    CONSTRAINT agent_operations_action_policy_json CHECK (
        action_policy IS NULL OR json_valid(action_policy)
    ),
    CONSTRAINT agent_operations_outcome_reported_boolean CHECK (outcome_reported IN (0, 1)),
    CONSTRAINT agent_operations_actor_kind CHECK (
        last_actor_kind IN ('client', 'worker', 'reviewer')
    ),
    -- Only an unknown operation waits for review.
    CONSTRAINT agent_operations_review_only_unknown CHECK (
        review_required_at IS NULL OR status = 'unknown'
    ),
    CONSTRAINT agent_operations_purge_only_terminal CHECK (
        purge_after IS NULL OR status IN ('succeeded', 'failed_final')
    ),
    -- Every time in the one comparable form; `IS` lets a NULL through and nothing else that
    -- strftime would not write back unchanged.
    CONSTRAINT agent_operations_times CHECK (
        created_at IS strftime('%Y-%m-%dT%H:%M:%fZ', created_at)
        AND updated_at IS strftime('%Y-%m-%dT%H:%M:%fZ', updated_at)
        AND lease_until IS strftime('%Y-%m-%dT%H:%M:%fZ', lease_until)
        AND unknown_since IS strftime('%Y-%m-%dT%H:%M:%fZ', unknown_since)
        AND next_check_at IS strftime('%Y-%m-%dT%H:%M:%fZ', next_check_at)
        AND review_required_at IS strftime('%Y-%m-%dT%H:%M:%fZ', review_required_at)
        AND purge_after IS strftime('%Y-%m-%dT%H:%M:%fZ', purge_after)
        AND reconcile_lease_until IS strftime('%Y-%m-%dT%H:%M:%fZ', reconcile_lease_until)
    )
) STRICT;

-- Work for the reconcile worker: unknown operations by due time, and leases by expiry.
CREATE INDEX agent_operations_unknown_due
    ON agent_operations (next_check_at)
    WHERE status = 'unknown';
CREATE INDEX agent_operations_in_progress_lease
    ON agent_operations (lease_until)
    WHERE status = 'in_progress';
-- ListOperations: newest first within a namespace.
CREATE INDEX agent_operations_namespace_created
    ON agent_operations (namespace, created_at DESC, operation_key DESC);
-- The review queue, oldest first.
CREATE INDEX agent_operations_review_queue
    ON agent_operations (namespace, review_required_at, operation_key)
    WHERE review_required_at IS NOT NULL;
CREATE INDEX agent_operations_purge_due
    ON agent_operations (purge_after)
    WHERE purge_after IS NOT NULL;
-- Duplicate intent under a new key: the same request registered under other keys.
CREATE INDEX agent_operations_same_request
    ON agent_operations (namespace, action_type, request_hash);

-- Terminal states never change: a succeeded or failed_final row keeps its status and outcome.
CREATE TRIGGER agent_operations_terminal_is_final
    BEFORE UPDATE ON agent_operations
    FOR EACH ROW
    WHEN OLD.status IN ('succeeded', 'failed_final')
         AND (NEW.status IS NOT OLD.status
              OR NEW.request_hash IS NOT OLD.request_hash
              OR NEW.external_id IS NOT OLD.external_id
              OR NEW.result_json IS NOT OLD.result_json
              OR NEW.error_code IS NOT OLD.error_code)
BEGIN
    SELECT RAISE(ABORT, 'a terminal operation cannot change');
END;

-- The append-only history of every transition. Each statement that changes an operation's
-- status (or escalates it) also sets who did it and why in the last_actor_* columns; the
-- triggers below copy each transition here in the same transaction, with the database clock,
-- so no code path can change a status without a history entry. AUTOINCREMENT: an event id is
-- never reused, even after retention deleted the newest events.
CREATE TABLE operation_events (
    event_id      INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace     TEXT    NOT NULL,
    operation_key TEXT    NOT NULL,
    from_status   TEXT,
    to_status     TEXT    NOT NULL,
    attempt_count INTEGER NOT NULL,
    review        INTEGER NOT NULL CHECK (review IN (0, 1)),
    actor_kind    TEXT    NOT NULL,
    actor         TEXT    NOT NULL,
    reason        TEXT,
    occurred_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

CREATE INDEX operation_events_by_operation
    ON operation_events (namespace, operation_key, event_id);

CREATE TRIGGER agent_operations_event_on_insert
    AFTER INSERT ON agent_operations
    FOR EACH ROW
BEGIN
    INSERT INTO operation_events (namespace, operation_key, from_status, to_status,
                                  attempt_count, review, actor_kind, actor, reason)
    VALUES (NEW.namespace, NEW.operation_key, NULL, NEW.status, NEW.attempt_count,
            NEW.review_required_at IS NOT NULL, NEW.last_actor_kind, NEW.last_actor,
            NEW.last_reason);
END;

CREATE TRIGGER agent_operations_event_on_transition
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status
         OR OLD.attempt_count IS NOT NEW.attempt_count
         OR OLD.outcome_reported IS NOT NEW.outcome_reported
         OR (OLD.review_required_at IS NULL) IS NOT (NEW.review_required_at IS NULL)
BEGIN
    INSERT INTO operation_events (namespace, operation_key, from_status, to_status,
                                  attempt_count, review, actor_kind, actor, reason)
    VALUES (NEW.namespace, NEW.operation_key, OLD.status, NEW.status, NEW.attempt_count,
            NEW.review_required_at IS NOT NULL, NEW.last_actor_kind, NEW.last_actor,
            NEW.last_reason);
END;

-- The history is append-only: entries are never rewritten (retention may delete them).
CREATE TRIGGER operation_events_append_only
    BEFORE UPDATE ON operation_events
    FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'operation_events is append-only');
END;

-- Sets purge_after on every transition into a terminal state, whoever makes it, from the
-- registered policy's retention_days (35 days without one). SQLite triggers cannot assign
-- NEW, so this one updates the row just written; the update changes no status, so it adds no
-- history entry, and the terminal guard lets it through.
CREATE TRIGGER agent_operations_set_purge_after
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN NEW.status IN ('succeeded', 'failed_final') AND OLD.status IS NOT NEW.status
BEGIN
    UPDATE agent_operations
    SET purge_after = strftime('%Y-%m-%dT%H:%M:%fZ', 'now',
            printf('%+d days',
                   coalesce(CAST(json_extract(NEW.action_policy, '$.retention_days')
                                 AS INTEGER), 35)))
    WHERE namespace = NEW.namespace AND operation_key = NEW.operation_key;
END;
