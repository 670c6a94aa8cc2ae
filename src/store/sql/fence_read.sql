namespace = $2 AND operation_key = $3 AND status = $4 AND attempt_count = $5
AND (status <> 'in_progress' OR {@lease_ended})
