WITH expired AS (
    SELECT namespace AS expired_namespace, operation_key AS expired_key FROM agent_operations
    WHERE {@expired} ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE agent_operations SET {@swept}
FROM expired WHERE namespace = expired_namespace AND operation_key = expired_key
