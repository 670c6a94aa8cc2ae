updated_at = {now}, last_actor_kind = 'client', last_actor = '', outcome_reported = TRUE
