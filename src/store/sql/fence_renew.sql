{@fence_token} AND status = 'in_progress' AND NOT ({@lease_ended})
