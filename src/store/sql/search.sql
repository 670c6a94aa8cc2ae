SELECT {@columns} FROM agent_operations
WHERE namespace = $2
  AND ({cast $3 text} IS NULL OR external_id = $3)
  AND ({cast $4 text} IS NULL OR {member business_references $4} = $5)
ORDER BY created_at DESC, operation_key DESC LIMIT $6
