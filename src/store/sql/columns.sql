namespace, operation_key, action_type, request_hash, status, attempt_count, external_id,
result_json, error_code, lease_until, {text lease_id} AS lease_id, lease_attempt_sha256,
{text business_references} AS business_references, unknown_since, next_check_at,
reconcile_attempts, created_at, updated_at, review_required_at, review_reason, last_actor_kind,
{text action_policy} AS action_policy, trace_context, {now} AS observed_at
