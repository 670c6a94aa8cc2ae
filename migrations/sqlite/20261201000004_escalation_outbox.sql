-- Escalation webhooks: the durable outbox of the events a configured URL receives when an
-- operation enters the review queue (`operation.review_required`) and when its review ends
-- (`operation.review_resolved`), as on Postgres (migration 20261201000007).
--
-- The rule (domain::escalation::event_for): an event is written exactly when an operation's
-- review_required_at changes between NULL and set, by a trigger on agent_operations, inside
-- the statement that makes the change, like the history. Each row is a snapshot of what the
-- journal already stores (no payload, no result). event_id is a random (version 4) UUID in
-- its hyphenated lowercase form: the receivers' de-duplication key.
CREATE TABLE escalation_outbox (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id            TEXT    NOT NULL UNIQUE,
    event_type          TEXT    NOT NULL,
    occurred_at         TEXT    NOT NULL,
    namespace           TEXT    NOT NULL,
    operation_key       TEXT    NOT NULL,
    action_type         TEXT    NOT NULL,
    status              TEXT    NOT NULL,
    attempt_count       INTEGER NOT NULL,
    reason              TEXT,
    actor_kind          TEXT    NOT NULL,
    actor               TEXT    NOT NULL,
    business_references TEXT    NOT NULL DEFAULT '{}',
    state               TEXT    NOT NULL DEFAULT 'pending',
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     TEXT    NOT NULL,
    last_attempt_at     TEXT,
    last_status_code    INTEGER,
    last_error          TEXT,
    finished_at         TEXT,
    CONSTRAINT escalation_outbox_event_id_uuid CHECK (
        length(event_id) = 36 AND event_id NOT GLOB '*[^0-9a-f-]*'
    ),
    CONSTRAINT escalation_outbox_event_type CHECK (
        event_type IN ('operation.review_required', 'operation.review_resolved')
    ),
    CONSTRAINT escalation_outbox_state CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT escalation_outbox_finished CHECK ((state = 'pending') = (finished_at IS NULL)),
    CONSTRAINT escalation_outbox_attempts_non_negative CHECK (attempts >= 0),
    CONSTRAINT escalation_outbox_lengths CHECK (
        length(last_error) <= 100 AND length(reason) <= 500
    ),
    CONSTRAINT escalation_outbox_times CHECK (
        occurred_at IS strftime('%Y-%m-%dT%H:%M:%fZ', occurred_at)
        AND next_attempt_at IS strftime('%Y-%m-%dT%H:%M:%fZ', next_attempt_at)
        AND last_attempt_at IS strftime('%Y-%m-%dT%H:%M:%fZ', last_attempt_at)
        AND finished_at IS strftime('%Y-%m-%dT%H:%M:%fZ', finished_at)
    )
) STRICT;

CREATE INDEX escalation_outbox_due
    ON escalation_outbox (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX escalation_outbox_by_operation
    ON escalation_outbox (namespace, operation_key, seq);
CREATE INDEX escalation_outbox_dead
    ON escalation_outbox (finished_at)
    WHERE state = 'dead';

CREATE TRIGGER agent_operations_escalation_event
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN (OLD.review_required_at IS NULL) IS NOT (NEW.review_required_at IS NULL)
BEGIN
    INSERT INTO escalation_outbox (event_id, event_type, occurred_at, namespace, operation_key,
                                   action_type, status, attempt_count, reason, actor_kind,
                                   actor, business_references, next_attempt_at)
    VALUES (
        -- A version 4 UUID: 122 random bits, the version nibble 4, the variant bits 10.
        lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
            || substr(lower(hex(randomblob(2))), 2) || '-'
            || substr('89ab', 1 + (abs(random()) % 4), 1)
            || substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
        CASE WHEN NEW.review_required_at IS NOT NULL
             THEN 'operation.review_required' ELSE 'operation.review_resolved' END,
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        NEW.namespace, NEW.operation_key, NEW.action_type, NEW.status, NEW.attempt_count,
        CASE WHEN NEW.review_required_at IS NOT NULL
             THEN NEW.review_reason ELSE NEW.last_reason END,
        NEW.last_actor_kind, NEW.last_actor, NEW.business_references,
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
