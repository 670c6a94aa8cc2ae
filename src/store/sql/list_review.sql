SELECT {@columns} FROM agent_operations
WHERE review_required_at IS NOT NULL AND namespace = $2
  AND (review_required_at, operation_key) > ({time $3}, $4)
  AND ({text $6} IS NULL OR action_type = $6)
  AND ($7 <= 0 OR review_required_at <= {now- $7})
ORDER BY review_required_at, operation_key LIMIT $5
