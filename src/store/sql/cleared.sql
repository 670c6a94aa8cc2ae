lease_until = NULL, unknown_since = NULL, next_check_at = NULL, review_required_at = NULL,
review_reason = NULL
