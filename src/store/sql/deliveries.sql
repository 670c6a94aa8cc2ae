SELECT {@outbox_columns} FROM escalation_outbox
WHERE namespace = $2 AND operation_key = $3
ORDER BY seq
