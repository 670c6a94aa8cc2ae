-- The W3C trace context (a `traceparent` value, https://www.w3.org/TR/trace-context/) of the
-- request that registered the operation, so that a reconcile attempt long after it can link
-- its spans to the registering trace. It names a trace and a span, never a person, a payload
-- or a key; NULL when the registering request carried none and tracing was off.
ALTER TABLE agent_operations
    ADD COLUMN trace_context TEXT,
    ADD CONSTRAINT agent_operations_trace_context_format CHECK (
        trace_context IS NULL
        OR (trace_context ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            AND substr(trace_context, 4, 32) <> repeat('0', 32)
            AND substr(trace_context, 37, 16) <> repeat('0', 16))
    );

-- Backlog gauges: the oldest unknown operation is the first entry of this index, and the
-- number of unknown operations an index-only count over it.
CREATE INDEX agent_operations_unknown_since
    ON agent_operations (unknown_since)
    WHERE status = 'unknown';
