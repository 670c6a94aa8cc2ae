WITH v AS (SELECT * FROM {@values}),
inserted AS ({@insert} RETURNING {@columns}, true AS inserted)
SELECT * FROM inserted
UNION ALL
SELECT {@columns}, false AS inserted FROM agent_operations JOIN v
    ON namespace = v.p2 AND operation_key = v.p3
WHERE NOT EXISTS (SELECT 1 FROM inserted WHERE inserted.namespace = v.p2
                                         AND inserted.operation_key = v.p3)
