status = 'failed_final', error_code = $6, lease_until = NULL, unknown_since = NULL,
next_check_at = NULL, last_reason = $6, review_required_at = NULL, review_reason = NULL
