SELECT {@columns} FROM agent_operations WHERE namespace = $2 AND operation_key = $3
