UPDATE agent_operations SET {@swept}
WHERE rowid IN (SELECT rowid FROM agent_operations WHERE {@expired}
                ORDER BY lease_until LIMIT $2)
  AND {@expired}
