-- Steering messages, approvals, and each run's policy.

-- {"approval": "never"|"mutating"|"always", "allowed_tools": [...]}
ALTER TABLE runs ADD COLUMN policy jsonb NOT NULL DEFAULT '{}'::jsonb;

-- Messages a client sent to an active run; the worker moves them into the
-- conversation before its next model call.
CREATE TABLE run_inbox (
    id           bigserial PRIMARY KEY,
    run_id       uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    text         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    consumed_at  timestamptz
);
CREATE INDEX run_inbox_pending ON run_inbox (run_id, id) WHERE consumed_at IS NULL;

-- Tool calls waiting for (or given) a person's decision.
CREATE TABLE approvals (
    run_id       uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    call_id      text NOT NULL,
    name         text NOT NULL,
    arguments    jsonb NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    approved     boolean,
    reason       text,
    decided_by   text,
    decided_at   timestamptz,
    PRIMARY KEY (run_id, call_id)
);
