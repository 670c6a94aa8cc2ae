status = 'succeeded', external_id = $6, result_json = $7, error_code = NULL,
last_reason = 'completed', {@cleared}
