-- Escalation webhooks: a durable outbox of the events a configured URL receives when an
-- operation enters the review queue (`operation.review_required`) and when its review ends
-- (`operation.review_resolved`).
--
-- The rule (domain::escalation::event_for): an event is written exactly when an operation's
-- review_required_at changes between NULL and set, by a trigger on agent_operations, in the
-- same transaction as the change itself, like the history. No code path can escalate or
-- resolve without its event, and an event is never written for a change that rolled back.
--
-- Each row is a snapshot of what the journal already stores (no payload, no result), so that
-- the event's body is the same on every delivery attempt. event_id is the receivers'
-- de-duplication key (the Standard Webhooks `webhook-id`). Delivery is a schedule, never an
-- open transaction: a worker claims a due row by pushing its next_attempt_at past a short
-- claim lease (FOR UPDATE SKIP LOCKED), posts it, then records the answer with
-- compare-and-set on the attempt it claimed.
CREATE TABLE escalation_outbox (
    event_id            UUID         PRIMARY KEY DEFAULT gen_random_uuid(),
    -- The order events were written in, for listings.
    seq                 BIGINT       GENERATED ALWAYS AS IDENTITY UNIQUE,
    event_type          VARCHAR(40)  NOT NULL,
    occurred_at         TIMESTAMPTZ  NOT NULL DEFAULT now(),
    namespace           VARCHAR(100) NOT NULL,
    operation_key       VARCHAR(200) NOT NULL,
    action_type         VARCHAR(80)  NOT NULL,
    -- The operation's status and attempt right after the change.
    status              VARCHAR(20)  NOT NULL,
    attempt_count       INTEGER      NOT NULL,
    -- review_required: the escalation reason (review_reason); review_resolved: the
    -- reviewer's (or reporter's) reason (last_reason).
    reason              VARCHAR(500),
    -- Who made the change: worker, reviewer or client, and its name.
    actor_kind          VARCHAR(20)  NOT NULL,
    actor               VARCHAR(200) NOT NULL,
    business_references JSONB        NOT NULL DEFAULT '{}',
    -- Delivery: pending until a 2xx answer (delivered) or until it is too old (dead).
    state               VARCHAR(20)  NOT NULL DEFAULT 'pending',
    attempts            INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at     TIMESTAMPTZ  NOT NULL DEFAULT now(),
    last_attempt_at     TIMESTAMPTZ,
    last_status_code    INTEGER,
    last_error          VARCHAR(100),
    finished_at         TIMESTAMPTZ,
    CONSTRAINT escalation_outbox_event_type CHECK (
        event_type IN ('operation.review_required', 'operation.review_resolved')
    ),
    CONSTRAINT escalation_outbox_state CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT escalation_outbox_finished CHECK ((state = 'pending') = (finished_at IS NULL)),
    CONSTRAINT escalation_outbox_attempts_non_negative CHECK (attempts >= 0)
);

-- Due deliveries, by schedule.
CREATE INDEX escalation_outbox_due
    ON escalation_outbox (next_attempt_at)
    WHERE state = 'pending';
-- An operation's events (its deliveries, the purge).
CREATE INDEX escalation_outbox_by_operation
    ON escalation_outbox (namespace, operation_key, seq);
-- Events given up on, counted by the gauges.
CREATE INDEX escalation_outbox_dead
    ON escalation_outbox (finished_at)
    WHERE state = 'dead';

CREATE FUNCTION agent_operations_record_escalation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO escalation_outbox (event_type, namespace, operation_key, action_type, status,
                                   attempt_count, reason, actor_kind, actor,
                                   business_references)
    VALUES (CASE WHEN NEW.review_required_at IS NOT NULL
                 THEN 'operation.review_required' ELSE 'operation.review_resolved' END,
            NEW.namespace, NEW.operation_key, NEW.action_type, NEW.status, NEW.attempt_count,
            CASE WHEN NEW.review_required_at IS NOT NULL
                 THEN NEW.review_reason ELSE NEW.last_reason END,
            NEW.last_actor_kind, NEW.last_actor, NEW.business_references);
    RETURN NULL;
END;
$$;

CREATE TRIGGER agent_operations_escalation_event
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN ((OLD.review_required_at IS NULL) IS DISTINCT FROM (NEW.review_required_at IS NULL))
    EXECUTE FUNCTION agent_operations_record_escalation();
