status = 'succeeded', external_id = COALESCE($10, external_id), result_json = $11,
error_code = NULL, {@cleared}
