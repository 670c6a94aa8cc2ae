SELECT {@columns} FROM agent_operations
WHERE namespace = $2 AND ({cast $3 text} IS NULL OR status = $3)
  AND ({cast $4 text} IS NULL OR action_type = $4)
  AND (created_at, operation_key) < ({cast $5 timestamptz}, $6)
ORDER BY created_at DESC, operation_key DESC LIMIT $7
