-- Kiln's first schema: sessions, runs (the queue), messages, events,
-- webhook deliveries. See docs/architecture.md for the why of each column.

CREATE TABLE sessions (
    id          uuid PRIMARY KEY,
    owner       text NOT NULL,
    repo_url    text,
    repo_ref    text,
    -- Sandbox settings chosen for this session (image, limits); JSON so new
    -- settings need no migration.
    sandbox     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE runs (
    id                uuid PRIMARY KEY,
    session_id        uuid NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    owner             text NOT NULL,
    status            text NOT NULL CHECK (status IN
                        ('queued','running','awaiting_approval','succeeded','failed','cancelled','timed_out')),
    prompt            text NOT NULL,
    model             jsonb NOT NULL DEFAULT '{}'::jsonb,
    limits            jsonb NOT NULL DEFAULT '{}'::jsonb,
    trigger           text NOT NULL DEFAULT 'api' CHECK (trigger IN ('api','github')),
    idempotency_key   text,
    priority          integer NOT NULL DEFAULT 0,
    attempt           integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL DEFAULT 3,
    lease_owner       text,
    lease_expires_at  timestamptz,
    cancel_requested  boolean NOT NULL DEFAULT false,
    -- Seq of the newest event. Incremented in the same statement that
    -- inserts the event, so seqs are dense per run.
    last_event_seq    bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    result            jsonb,
    error             text
);

-- Claiming only ever looks at queued runs; a partial index keeps that
-- lookup small however many finished runs the table holds.
CREATE INDEX runs_queue ON runs (priority, created_at) WHERE status = 'queued';
-- The reaper scans active runs by lease expiry.
CREATE INDEX runs_leases ON runs (lease_expires_at) WHERE status IN ('running','awaiting_approval');
-- Listing a subject's runs newest first, with cursor paging on (created_at, id).
CREATE INDEX runs_owner_created ON runs (owner, created_at DESC, id DESC);
CREATE UNIQUE INDEX runs_idempotency ON runs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE messages (
    session_id  uuid NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    run_id      uuid REFERENCES runs(id) ON DELETE SET NULL,
    role        text NOT NULL CHECK (role IN ('system','user','assistant','tool')),
    parts       jsonb NOT NULL,
    usage       jsonb,
    model       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE events (
    run_id   uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq      bigint NOT NULL,
    kind     text NOT NULL,
    payload  jsonb NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE webhook_deliveries (
    delivery_id  text PRIMARY KEY,
    event        text NOT NULL,
    action       text,
    repo         text,
    received_at  timestamptz NOT NULL DEFAULT now(),
    run_id       uuid REFERENCES runs(id) ON DELETE SET NULL
);
