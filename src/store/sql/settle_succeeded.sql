status = 'succeeded', external_id = $6, result_json = $7, error_code = NULL,
lease_until = NULL, unknown_since = NULL, next_check_at = NULL, last_reason = 'completed',
review_required_at = NULL, review_reason = NULL
