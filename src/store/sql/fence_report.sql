{@fence_token}
AND (status = 'in_progress' OR (status IN ('unknown', 'pending') AND NOT outcome_reported))
