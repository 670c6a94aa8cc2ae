SELECT
  (SELECT count(*) FROM agent_operations WHERE status = 'unknown') AS unknown,
  (SELECT {age min(unknown_since)} FROM agent_operations WHERE status = 'unknown')
      AS oldest_unknown_seconds,
  (SELECT count(*) FROM agent_operations WHERE review_required_at IS NOT NULL) AS review_queue,
  (SELECT {age min(review_required_at)} FROM agent_operations
      WHERE review_required_at IS NOT NULL) AS oldest_review_seconds,
  overdue.operations AS overdue,
  overdue.most_seconds AS most_overdue_seconds
FROM (
  SELECT count(*) AS operations, max(seconds) AS most_seconds
  FROM (
    SELECT {age unknown_since} - {policy unknown_after_seconds} AS seconds
    FROM agent_operations
    WHERE status = 'unknown' AND review_required_at IS NULL
  ) unresolved
  WHERE seconds > 0
) overdue
