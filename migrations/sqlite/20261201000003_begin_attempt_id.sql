-- The attempt id of the Begin that was granted the current lease, kept as its SHA-256 in 64
-- lowercase hex digits, as on Postgres (migration 20261201000006): a Begin repeated with the
-- same attempt id while that lease is live gets the same lease token again, rebuilt from
-- attempt_count and lease_id. Every claim replaces it (NULL when the claiming Begin sent none).
ALTER TABLE agent_operations ADD COLUMN lease_attempt_sha256 TEXT
    CONSTRAINT agent_operations_lease_attempt_sha256_format CHECK (
        lease_attempt_sha256 IS NULL
        OR (length(lease_attempt_sha256) = 64
            AND lease_attempt_sha256 NOT GLOB '*[^0-9a-f]*')
    );
