-- The operation journal: the source article's agent_operations table (step 3), extended with
-- a namespace (tenant) in the primary key, fencing-token leases, business references and
-- reconcile scheduling. The status CHECK is the article's; named constraints encode the
-- lease rules so that no code path can write a row that breaks them.
CREATE TABLE agent_operations (
    namespace           VARCHAR(100) NOT NULL DEFAULT 'default',
    operation_key       VARCHAR(200) NOT NULL,
    action_type         VARCHAR(80)  NOT NULL,
    request_hash        CHAR(64)     NOT NULL,
    status              VARCHAR(20)  NOT NULL,
    attempt_count       INTEGER      NOT NULL DEFAULT 0,
    external_id         VARCHAR(200),
    result_json         TEXT,
    error_code          VARCHAR(100),
    lease_until         TIMESTAMPTZ,
    -- Random part of the fencing token of the current (or last) lease.
    lease_id            UUID,
    -- Business links such as {"order_id": "817"}; never hashed.
    business_references JSONB        NOT NULL DEFAULT '{}'::jsonb,
    -- When the outcome became unknown (reported, or the lease ended without a report): the
    -- absence grace window for lookups counts from here.
    unknown_since       TIMESTAMPTZ,
    -- When the reconcile path next looks the operation up, and how often it has.
    next_check_at       TIMESTAMPTZ,
    reconcile_attempts  INTEGER      NOT NULL DEFAULT 0,
    created_at          TIMESTAMPTZ  NOT NULL,
    updated_at          TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (namespace, operation_key),
    CONSTRAINT agent_operations_status_check CHECK (status IN (
        'pending',
        'in_progress',
        'unknown',
        'succeeded',
        'failed_final'
    )),
    CONSTRAINT agent_operations_request_hash_hex CHECK (request_hash ~ '^[0-9a-f]{64}$'),
    -- An in_progress row always has a lease; no other row has one.
    CONSTRAINT agent_operations_in_progress_has_lease CHECK (
        (status = 'in_progress') = (lease_until IS NOT NULL)
    ),
    CONSTRAINT agent_operations_in_progress_has_lease_id CHECK (
        status <> 'in_progress' OR lease_id IS NOT NULL
    ),
    CONSTRAINT agent_operations_attempt_count_non_negative CHECK (attempt_count >= 0),
    CONSTRAINT agent_operations_references_object CHECK (jsonb_typeof(business_references) = 'object')
);

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

-- Terminal states never change: a succeeded or failed_final row keeps its status and outcome.
CREATE FUNCTION agent_operations_terminal_is_final() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('succeeded', 'failed_final')
       AND (NEW.status IS DISTINCT FROM OLD.status
            OR NEW.request_hash IS DISTINCT FROM OLD.request_hash
            OR NEW.external_id IS DISTINCT FROM OLD.external_id
            OR NEW.result_json IS DISTINCT FROM OLD.result_json
            OR NEW.error_code IS DISTINCT FROM OLD.error_code) THEN
        RAISE EXCEPTION 'a terminal operation (%) cannot change', OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER agent_operations_terminal_is_final
    BEFORE UPDATE ON agent_operations
    FOR EACH ROW
    WHEN (OLD.status IN ('succeeded', 'failed_final'))
    EXECUTE FUNCTION agent_operations_terminal_is_final();
