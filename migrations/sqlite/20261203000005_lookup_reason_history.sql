-- What a provider lookup said about an operation that stays unknown is history too, as on
-- Postgres (migration 20261203000008): an entry, from unknown to unknown, whenever the
-- reconcile worker's reason changes, none for the same answer again.
CREATE TRIGGER agent_operations_event_on_lookup
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN OLD.status = 'unknown' AND NEW.status = 'unknown'
         AND OLD.attempt_count = NEW.attempt_count
         AND OLD.outcome_reported IS NEW.outcome_reported
         AND (OLD.review_required_at IS NULL) = (NEW.review_required_at IS NULL)
         AND NEW.last_actor_kind = 'worker'
         AND NEW.last_reason IS NOT OLD.last_reason
BEGIN
    INSERT INTO operation_events (namespace, operation_key, from_status, to_status,
                                  attempt_count, review, actor_kind, actor, reason)
    VALUES (NEW.namespace, NEW.operation_key, OLD.status, NEW.status, NEW.attempt_count,
            NEW.review_required_at IS NOT NULL, NEW.last_actor_kind, NEW.last_actor,
            NEW.last_reason);
END;
