SELECT
  (SELECT count(*) FROM agent_operations WHERE status = 'unknown') AS unknown,
  (SELECT {age min(unknown_since)} FROM agent_operations WHERE status = 'unknown')
      AS oldest_unknown_seconds,
  (SELECT count(*) FROM agent_operations WHERE review_required_at IS NOT NULL) AS review_queue
