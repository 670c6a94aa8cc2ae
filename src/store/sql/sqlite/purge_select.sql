SELECT rowid AS count FROM agent_operations WHERE {@purgeable} ORDER BY purge_after LIMIT $1
