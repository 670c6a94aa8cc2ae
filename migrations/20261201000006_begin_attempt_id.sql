-- The attempt id of the Begin that was granted the current lease (BeginOperationRequest
-- .attempt_id), kept as its SHA-256 in 64 lowercase hex digits: a Begin repeated with the
-- same attempt id while that lease is live gets the same lease token again (rebuilt from
-- attempt_count and lease_id), so the id itself, which gives the lease back, is never stored.
-- Every claim replaces it (NULL when the claiming Begin sent none); nothing else reads it.
ALTER TABLE agent_operations
    ADD COLUMN lease_attempt_sha256 TEXT,
    -- Every existing row holds NULL (the column is new): NOT VALID spares the scan of the
    -- whole table under its lock; rows written from now on are checked.
    ADD CONSTRAINT agent_operations_lease_attempt_sha256_format CHECK (
        lease_attempt_sha256 IS NULL OR lease_attempt_sha256 ~ '^[0-9a-f]{64}$'
    ) NOT VALID;
