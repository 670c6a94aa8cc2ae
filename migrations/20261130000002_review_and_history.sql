-- Human review and an append-only history of every transition.
--
-- Each statement that changes an operation's status (or escalates it) also sets who did it
-- and why in the last_actor_* columns; a trigger copies each transition into
-- operation_events in the same transaction, so no code path can change a status without a
-- history entry, and the history uses the database clock.
ALTER TABLE agent_operations
    ADD COLUMN review_required_at TIMESTAMPTZ,
    ADD COLUMN review_reason      VARCHAR(100),
    ADD COLUMN last_actor_kind    VARCHAR(20) NOT NULL DEFAULT 'client',
    ADD COLUMN last_actor         VARCHAR(200) NOT NULL DEFAULT '',
    ADD COLUMN last_reason        VARCHAR(500),
    -- Whether the holder of the current attempt has reported an outcome: a token reports
    -- once (repeats of the same outcome are answered from the row).
    ADD COLUMN outcome_reported   BOOLEAN NOT NULL DEFAULT false,
    ADD CONSTRAINT agent_operations_actor_kind CHECK (
        last_actor_kind IN ('client', 'worker', 'reviewer')
    ),
    -- Only an unknown operation waits for review.
    ADD CONSTRAINT agent_operations_review_only_unknown CHECK (
        review_required_at IS NULL OR status = 'unknown'
    );

-- The review queue, oldest first.
CREATE INDEX agent_operations_review_queue
    ON agent_operations (namespace, review_required_at, operation_key)
    WHERE review_required_at IS NOT NULL;

CREATE TABLE operation_events (
    event_id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace     VARCHAR(100) NOT NULL,
    operation_key VARCHAR(200) NOT NULL,
    from_status   VARCHAR(20),
    to_status     VARCHAR(20)  NOT NULL,
    attempt_count INTEGER      NOT NULL,
    review        BOOLEAN      NOT NULL,
    actor_kind    VARCHAR(20)  NOT NULL,
    actor         VARCHAR(200) NOT NULL,
    reason        VARCHAR(500),
    occurred_at   TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE INDEX operation_events_by_operation
    ON operation_events (namespace, operation_key, event_id);

CREATE FUNCTION agent_operations_record_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operation_events (namespace, operation_key, from_status, to_status,
                                  attempt_count, review, actor_kind, actor, reason)
    VALUES (NEW.namespace, NEW.operation_key,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
            NEW.status, NEW.attempt_count, NEW.review_required_at IS NOT NULL,
            NEW.last_actor_kind, NEW.last_actor, NEW.last_reason);
    RETURN NULL;
END;
$$;

CREATE TRIGGER agent_operations_event_on_insert
    AFTER INSERT ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agent_operations_record_event();

CREATE TRIGGER agent_operations_event_on_transition
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.attempt_count IS DISTINCT FROM NEW.attempt_count
          OR OLD.outcome_reported IS DISTINCT FROM NEW.outcome_reported
          OR (OLD.review_required_at IS NULL) IS DISTINCT FROM (NEW.review_required_at IS NULL))
    EXECUTE FUNCTION agent_operations_record_event();

-- The history is append-only: entries are never rewritten (retention may delete them).
CREATE FUNCTION operation_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'operation_events is append-only' USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER operation_events_append_only
    BEFORE UPDATE ON operation_events
    FOR EACH ROW EXECUTE FUNCTION operation_events_append_only();
