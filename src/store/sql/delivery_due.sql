state = 'pending' AND next_attempt_at <= {now}
