WITH doomed AS (
    SELECT namespace, operation_key FROM agent_operations WHERE {@purgeable}
    ORDER BY purge_after LIMIT $1 FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM agent_operations o USING doomed d
    WHERE o.namespace = d.namespace AND o.operation_key = d.operation_key
      AND o.status IN ('succeeded', 'failed_final')
    RETURNING o.namespace, o.operation_key),
history AS (
    DELETE FROM operation_events e USING gone g
    WHERE e.namespace = g.namespace AND e.operation_key = g.operation_key),
outbox AS (
    DELETE FROM escalation_outbox x USING gone g
    WHERE x.namespace = g.namespace AND x.operation_key = g.operation_key)
SELECT COUNT(*) AS count FROM gone
