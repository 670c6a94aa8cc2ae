DELETE FROM agent_operations WHERE rowid IN (SELECT value FROM json_each($1))
  AND status IN ('succeeded', 'failed_final')
