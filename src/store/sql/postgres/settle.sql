UPDATE agent_operations SET {@settlement}, {@reported}
FROM (SELECT status AS previous_status FROM agent_operations
      WHERE namespace = $2 AND operation_key = $3 FOR NO KEY UPDATE) previous
WHERE {@fence_report}
RETURNING {@columns}, previous.previous_status
