purge_after < {now} AND status IN ('succeeded', 'failed_final')
