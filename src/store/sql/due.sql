status = 'unknown' AND next_check_at <= {now} AND {@reconcile_free}
