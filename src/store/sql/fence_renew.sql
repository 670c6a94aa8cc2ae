namespace = $2 AND operation_key = $3 AND attempt_count = $4 AND lease_id = {uuid $5}
AND status = 'in_progress' AND NOT ({@lease_ended})
