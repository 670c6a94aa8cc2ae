SELECT
  (SELECT count(*) FROM escalation_outbox WHERE state = 'pending') AS pending,
  (SELECT {age min(occurred_at)} FROM escalation_outbox WHERE state = 'pending')
      AS oldest_pending_seconds,
  (SELECT count(*) FROM escalation_outbox WHERE state = 'dead') AS dead
