status = 'unknown', error_code = $6, lease_until = NULL,
unknown_since = COALESCE(unknown_since, {now}),
next_check_at = CASE WHEN review_required_at IS NULL THEN {now+ $7} END, last_reason = $6
