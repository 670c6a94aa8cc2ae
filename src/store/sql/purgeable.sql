purge_after < {dbnow} AND status IN ('succeeded', 'failed_final')
