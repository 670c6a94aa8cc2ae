UPDATE escalation_outbox
SET attempts = attempts + 1, next_attempt_at = {now+ $3}, last_attempt_at = {now}
WHERE seq IN (SELECT seq FROM escalation_outbox WHERE {@delivery_due}
              ORDER BY next_attempt_at LIMIT $2)
RETURNING {@outbox_columns}
