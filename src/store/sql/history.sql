SELECT event_id, from_status, to_status, attempt_count, review, actor_kind, actor, reason,
    occurred_at
FROM operation_events
WHERE namespace = $1 AND operation_key = $2 AND event_id > $3
ORDER BY event_id LIMIT $4
