-- A reconcile lease: while a worker (or an operator's ReconcileOperation) is looking an
-- operation up, nobody else may look it up. Separate from next_check_at, which schedules.
ALTER TABLE agent_operations
    ADD COLUMN reconcile_lease_until TIMESTAMPTZ;
