WITH due AS (
    SELECT namespace AS due_namespace, operation_key AS due_key FROM agent_operations
    WHERE {@due} ORDER BY next_check_at LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE agent_operations SET next_check_at = {now+ $3}, reconcile_lease_until = {now+ $3}
FROM due WHERE namespace = due_namespace AND operation_key = due_key
RETURNING {@columns}
