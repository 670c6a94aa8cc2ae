status = 'pending', error_code = 'released_for_retry', {@cleared}
