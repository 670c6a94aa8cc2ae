namespace = $2 AND operation_key = $3 AND attempt_count = $4 AND lease_id = {cast $5 uuid}
