status = 'in_progress' AND {@lease_ended}
