WITH due AS (
    SELECT event_id AS due_id FROM escalation_outbox
    WHERE {@delivery_due} ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE escalation_outbox
SET attempts = attempts + 1, next_attempt_at = {now+ $3}, last_attempt_at = {now}
FROM due WHERE event_id = due_id
RETURNING {@outbox_columns}
