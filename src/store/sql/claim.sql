UPDATE agent_operations
SET status = 'in_progress', attempt_count = attempt_count + 1, lease_until = {now+ $6},
    lease_id = {cast $7 uuid}, lease_attempt_sha256 = $8, error_code = NULL,
    unknown_since = NULL, next_check_at = NULL,
    last_actor_kind = 'client', last_actor = '', outcome_reported = FALSE,
    last_reason = CASE WHEN status = 'pending' THEN 'claimed' ELSE 'reclaimed_with_same_key' END,
    updated_at = {now}
WHERE {@fence_read} AND review_required_at IS NULL
RETURNING {@columns}
