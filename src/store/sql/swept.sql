status = 'unknown', error_code = 'lease_expired', unknown_since = lease_until,
lease_until = NULL, next_check_at = {now}, updated_at = {now}, last_actor_kind = 'worker',
last_actor = $3, last_reason = 'lease_expired'
