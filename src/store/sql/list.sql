SELECT {@columns} FROM agent_operations
WHERE namespace = $2 AND ({text $3} IS NULL OR status = $3)
  AND ({text $4} IS NULL OR action_type = $4)
  AND (created_at, operation_key) < ({time $5}, $6)
ORDER BY created_at DESC, operation_key DESC LIMIT $7
