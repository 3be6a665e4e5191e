-- Workers announce themselves, so containers a worker kept for itself (its
-- warm pool) can be removed by the others once it is gone.
CREATE TABLE workers (
    id          text PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

-- A session's container stays while the session is active or was active
-- recently; the idle check looks up a session's runs.
CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id, created_at);
