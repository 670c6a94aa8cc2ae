INSERT INTO agent_operations (namespace, operation_key, action_type, request_hash, status,
    attempt_count, lease_until, lease_id, business_references, last_actor_kind, last_actor,
    last_reason, action_policy, trace_context, lease_attempt_sha256, created_at, updated_at)
SELECT $2, $3, $4, $5, 'in_progress', 1, {now+ $6}, {cast $7 uuid}, {cast $8 jsonb}, 'client', '',
    'registered', {cast $9 jsonb}, $10, $11, {now}, {now} {rows}
ON CONFLICT (namespace, operation_key) DO NOTHING
