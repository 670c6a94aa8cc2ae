namespace, operation_key, action_type, request_hash, status, attempt_count, external_id,
result_json, error_code, lease_until, {cast lease_id text} AS lease_id, lease_attempt_sha256,
{cast business_references text} AS business_references, unknown_since, next_check_at,
reconcile_attempts, created_at, updated_at, review_required_at, review_reason, last_actor_kind,
{cast action_policy text} AS action_policy, trace_context, {now} AS observed_at
