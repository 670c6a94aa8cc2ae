status = 'failed_final', error_code = $6, last_reason = $6, {@cleared}
