DELETE FROM escalation_outbox WHERE (namespace, operation_key) IN (
    SELECT namespace, operation_key FROM agent_operations
    WHERE rowid IN (SELECT value FROM json_each($1)))
