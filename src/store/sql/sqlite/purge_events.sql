DELETE FROM operation_events
WHERE (namespace, operation_key) IN (SELECT value ->> 0, value ->> 1 FROM json_each($1))
