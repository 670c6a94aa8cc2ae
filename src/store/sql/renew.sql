UPDATE agent_operations SET lease_until = {now+ $6}, updated_at = {now}
WHERE {@fence_renew}
RETURNING {@columns}
