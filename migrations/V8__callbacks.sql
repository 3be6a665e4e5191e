-- Completion callbacks: a run may name a `callback_url`; when it ends, Kiln
-- POSTs its final state there (signed, retried, each attempt an event).
--
-- Same shape as the GitHub reports (V7): the debt is recorded by a trigger
-- in the transaction that ends the run, whoever ends it (its worker, a
-- client cancelling it while queued, the reaper), so no path can forget it
-- and no crash between "ended" and "called back" can lose it. Workers claim
-- owed callbacks under a lease they keep extending while they deliver.

ALTER TABLE runs ADD COLUMN callback_url text;

-- A row exists once the run has ended and owes a callback.
CREATE TABLE run_callbacks (
    run_id       uuid PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    url          text NOT NULL,
    -- Sent as `X-Kiln-Delivery` on every attempt: receivers drop repeats.
    delivery_id  uuid NOT NULL DEFAULT gen_random_uuid(),
    owed_since   timestamptz NOT NULL DEFAULT now(),
    -- Attempts made so far, across workers: a worker taking over a dead
    -- one's callback continues the count rather than starting again.
    attempts     integer NOT NULL DEFAULT 0,
    -- The delivery in progress: who holds it (fences every write of an
    -- attempt) and until when, unless extended.
    holder       uuid,
    lease_until  timestamptz,
    -- Set when the callback was answered with a 2xx, or given up on.
    settled_at   timestamptz,
    delivered    boolean NOT NULL DEFAULT false
);

CREATE INDEX run_callbacks_owed ON run_callbacks (owed_since) WHERE settled_at IS NULL;

CREATE FUNCTION kiln_callback_owed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_callbacks (run_id, url) VALUES (NEW.id, NEW.callback_url)
    ON CONFLICT (run_id) DO NOTHING;
    -- Wakes workers at once (they also poll).
    PERFORM pg_notify('kiln_callbacks_owed', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_callback_owed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.callback_url IS NOT NULL)
    EXECUTE FUNCTION kiln_callback_owed();
