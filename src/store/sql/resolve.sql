UPDATE agent_operations
SET {@resolution}, reconcile_lease_until = NULL, reconcile_attempts = reconcile_attempts + $6,
    last_actor_kind = $7, last_actor = $8, last_reason = $9, updated_at = {now}
WHERE {@fence_read}
RETURNING {@columns}
