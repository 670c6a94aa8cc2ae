WITH inserted AS ({@insert} RETURNING {@columns}, true AS inserted)
SELECT * FROM inserted
UNION ALL
SELECT {@columns}, false AS inserted FROM agent_operations
WHERE namespace = $2 AND operation_key = $3 AND NOT EXISTS (SELECT 1 FROM inserted)
