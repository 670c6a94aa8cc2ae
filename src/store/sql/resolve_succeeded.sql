status = 'succeeded', external_id = COALESCE($10, external_id), result_json = $11,
error_code = NULL, lease_until = NULL, unknown_since = NULL, next_check_at = NULL,
review_required_at = NULL, review_reason = NULL
