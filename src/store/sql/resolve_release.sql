status = 'pending', lease_until = NULL, error_code = 'released_for_retry',
unknown_since = NULL, next_check_at = NULL, review_required_at = NULL, review_reason = NULL
