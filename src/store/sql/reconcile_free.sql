(reconcile_lease_until IS NULL OR reconcile_lease_until < {now})
