UPDATE agent_operations SET {@settlement}, {@reported}
FROM (SELECT v.*, previous.status AS previous_status
      FROM {@values} JOIN agent_operations previous
          ON previous.namespace = v.p2 AND previous.operation_key = v.p3
      ORDER BY v.p2, v.p3 FOR NO KEY UPDATE OF previous) v
WHERE {@fence_report}
RETURNING {@columns}, v.previous_status
