SELECT {@columns} FROM agent_operations
WHERE review_required_at IS NOT NULL AND namespace = $2
  AND (review_required_at, operation_key) > ({cast $3 timestamptz}, $4)
  AND ({cast $6 text} IS NULL OR action_type = $6)
  AND ($7 <= 0 OR review_required_at <= {now- $7})
ORDER BY review_required_at, operation_key LIMIT $5
