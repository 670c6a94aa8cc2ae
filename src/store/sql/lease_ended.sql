lease_until <= {now}
