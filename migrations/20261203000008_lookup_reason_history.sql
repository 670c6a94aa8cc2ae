-- What a provider lookup said about an operation that stays unknown is history too
-- (docs/reconciliation.md, "From an answer to absent, succeeded or failed"): an entry, from
-- unknown to unknown, whenever the reconcile worker's reason changes — a redirect, a
-- timeout, an answer about another key, "not found" while the search may lag — and none
-- for the same answer again, so a worker checking every few seconds adds nothing while the
-- provider keeps saying the same. Transitions keep their own trigger
-- (agent_operations_event_on_transition); this one fires only when nothing else changed.
CREATE TRIGGER agent_operations_event_on_lookup
    AFTER UPDATE ON agent_operations
    FOR EACH ROW
    WHEN (OLD.status = 'unknown' AND NEW.status = 'unknown'
          AND OLD.attempt_count = NEW.attempt_count
          AND OLD.outcome_reported IS NOT DISTINCT FROM NEW.outcome_reported
          AND (OLD.review_required_at IS NULL) = (NEW.review_required_at IS NULL)
          AND NEW.last_actor_kind = 'worker'
          AND NEW.last_reason IS DISTINCT FROM OLD.last_reason)
    EXECUTE FUNCTION agent_operations_record_event();
