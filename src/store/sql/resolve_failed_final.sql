status = 'failed_final', error_code = $10, {@cleared}
