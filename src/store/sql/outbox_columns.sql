{cast event_id text} AS event_id, seq, event_type, occurred_at, namespace, operation_key,
action_type, status, attempt_count, reason, actor_kind, actor,
{cast business_references text} AS business_references, state, attempts, next_attempt_at,
last_attempt_at, last_status_code, last_error, finished_at, {now} AS observed_at
