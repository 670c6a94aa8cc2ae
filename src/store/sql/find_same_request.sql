SELECT operation_key FROM agent_operations
WHERE namespace = $2 AND action_type = $3 AND request_hash = {cast $4 char(64)}
  AND operation_key <> $5 AND (status IN ('pending', 'in_progress', 'unknown')
       OR (status = 'succeeded' AND updated_at > {now- $6}))
  AND NOT EXISTS (SELECT 1 FROM agent_operations WHERE namespace = $2 AND operation_key = $5)
ORDER BY created_at DESC LIMIT 1
