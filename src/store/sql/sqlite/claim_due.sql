UPDATE agent_operations SET next_check_at = {now+ $3}, reconcile_lease_until = {now+ $3}
WHERE rowid IN (SELECT rowid FROM agent_operations WHERE {@due}
                ORDER BY next_check_at LIMIT $2)
RETURNING {@columns}
