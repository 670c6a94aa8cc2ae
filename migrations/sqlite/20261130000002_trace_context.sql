-- The W3C trace context (a `traceparent` value, https://www.w3.org/TR/trace-context/) of the
-- request that registered the operation, as on Postgres (migration 20261130000005): it lets a
-- reconcile attempt long after link its spans to the registering trace. It names a trace and
-- a span, never a person, a payload or a key.
ALTER TABLE agent_operations ADD COLUMN trace_context TEXT
    CONSTRAINT agent_operations_trace_context_format CHECK (
        trace_context IS NULL
        OR (length(trace_context) = 55
            AND substr(trace_context, 1, 3) = '00-'
            AND substr(trace_context, 36, 1) = '-'
            AND substr(trace_context, 53, 1) = '-'
            AND NOT (substr(trace_context, 4, 32) || substr(trace_context, 37, 16)
                     || substr(trace_context, 54, 2)) GLOB '*[^0-9a-f]*'
            AND substr(trace_context, 4, 32) <> '00000000000000000000000000000000'
            AND substr(trace_context, 37, 16) <> '0000000000000000')
    );

-- Backlog gauges: the oldest unknown operation is the first entry of this index.
CREATE INDEX agent_operations_unknown_since
    ON agent_operations (unknown_since)
    WHERE status = 'unknown';
