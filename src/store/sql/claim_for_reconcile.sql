UPDATE agent_operations SET reconcile_lease_until = {now+ $4}
WHERE namespace = $2 AND operation_key = $3
  AND (status = 'unknown' OR ({@expired})) AND {@reconcile_free}
RETURNING {@columns}
