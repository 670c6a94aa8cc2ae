UPDATE escalation_outbox
SET state = $4, last_status_code = NULLIF($5, 0), last_error = $6,
    next_attempt_at = CASE WHEN $4 = 'pending' THEN {now+ $7} ELSE next_attempt_at END,
    finished_at = CASE WHEN $4 = 'pending' THEN NULL ELSE {now} END
WHERE event_id = {cast $2 uuid} AND attempts = $3 AND state = 'pending'
