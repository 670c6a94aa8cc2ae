SELECT
  (SELECT count(*) FROM agent_operations WHERE namespace = $2 AND status = 'unknown')
      AS unknown,
  (SELECT min(unknown_since) FROM agent_operations WHERE namespace = $2 AND status = 'unknown')
      AS oldest_unknown,
  (SELECT count(*) FROM agent_operations WHERE namespace = $2 AND status = 'in_progress')
      AS in_progress,
  (SELECT min(updated_at) FROM agent_operations
   WHERE namespace = $2 AND status = 'in_progress') AS oldest_in_progress,
  (SELECT count(*) FROM agent_operations WHERE namespace = $2 AND {@due}) AS due,
  (SELECT min(next_check_at) FROM agent_operations WHERE namespace = $2 AND {@due})
      AS oldest_due,
  (SELECT count(*) FROM agent_operations
   WHERE namespace = $2 AND review_required_at IS NOT NULL) AS review,
  (SELECT min(review_required_at) FROM agent_operations
   WHERE namespace = $2 AND review_required_at IS NOT NULL) AS oldest_review,
  {now} AS observed_at
