-- Rules stay those an operation was registered under, and terminal operations are kept for
-- their action's retention, then purged in bounded batches.
ALTER TABLE agent_operations
    -- The action policy in force when the operation was registered (JSON of the policy
    -- entry); later edits of the policy file never change the rules for recorded operations.
    ADD COLUMN action_policy JSONB,
    -- When a terminal operation may be purged: set on the transition to succeeded or
    -- failed_final, from the registered policy's retention_days. Never set otherwise.
    ADD COLUMN purge_after TIMESTAMPTZ,
    ADD CONSTRAINT agent_operations_purge_only_terminal CHECK (
        purge_after IS NULL OR status IN ('succeeded', 'failed_final')
    );

CREATE INDEX agent_operations_purge_due
    ON agent_operations (purge_after)
    WHERE purge_after IS NOT NULL;

-- Duplicate intent under a new key: the same request registered under other keys.
CREATE INDEX agent_operations_same_request
    ON agent_operations (namespace, action_type, request_hash);

-- Sets purge_after on every transition into a terminal state, whoever makes it.
CREATE FUNCTION agent_operations_set_purge_after() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('succeeded', 'failed_final')
       AND OLD.status IS DISTINCT FROM NEW.status THEN
        NEW.purge_after := now() + make_interval(
            days => COALESCE((NEW.action_policy ->> 'retention_days')::integer, 35));
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER agent_operations_set_purge_after
    BEFORE UPDATE ON agent_operations
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed_final') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agent_operations_set_purge_after();
