status = 'unknown', unknown_since = COALESCE(unknown_since, lease_until, {now}),
lease_until = NULL,
next_check_at = CASE WHEN review_required_at IS NULL THEN {now+ $10} END
