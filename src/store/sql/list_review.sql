SELECT {@columns} FROM agent_operations
WHERE review_required_at IS NOT NULL AND namespace = $2
  AND (review_required_at, operation_key) > ({cast $3 timestamptz}, $4)
ORDER BY review_required_at, operation_key LIMIT $5
