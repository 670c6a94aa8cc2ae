status = 'unknown', unknown_since = COALESCE(unknown_since, lease_until, {now}),
lease_until = NULL, next_check_at = NULL,
review_required_at = COALESCE(review_required_at, {now}),
review_reason = COALESCE(review_reason, $10)
