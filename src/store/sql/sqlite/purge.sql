DELETE FROM agent_operations WHERE rowid IN (
    SELECT rowid FROM agent_operations WHERE {@purgeable} ORDER BY purge_after LIMIT $1)
RETURNING namespace, operation_key
