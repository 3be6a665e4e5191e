-- A run's `deliver.git` push (issue 28) is owed like a group's (V24): one
-- table, one claim, one lease, one record for both. A single run owes its
-- push with its end, in the transaction that ends it (a trigger, whoever
-- ends it: its worker, a cancel, the reaper), so a worker lost between
-- "the run ended" and "pushed" loses nothing: any worker claims the owed
-- push once the claim is free. A push that failed for a reason that may
-- pass (the remote down, a 5xx, a network error) is owed again after a
-- backoff, up to a bound the worker sets; then it is given up.
ALTER TABLE group_git_deliveries RENAME TO git_deliveries;
ALTER INDEX group_git_deliveries_owed RENAME TO git_deliveries_owed;

ALTER TABLE git_deliveries
    -- Attempts made so far (each ended with a `delivery.*` event).
    ADD COLUMN attempts   integer NOT NULL DEFAULT 0,
    -- A retry waits until then.
    ADD COLUMN not_before timestamptz,
    ADD COLUMN owed_since timestamptz NOT NULL DEFAULT now();

CREATE FUNCTION kiln_git_delivery_owed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO git_deliveries (run_id) VALUES (NEW.id) ON CONFLICT (run_id) DO NOTHING;
    RETURN NULL;
END;
$$;

-- A group of attempts (`attempt_count`) owes its push with its choice
-- instead (`POST /v1/runs/{id}/select`); attempts never carry `deliver`.
CREATE TRIGGER runs_git_delivery_owed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.attempt_count IS NULL
          AND jsonb_typeof(NEW.policy->'deliver'->'git') = 'object')
    EXECUTE FUNCTION kiln_git_delivery_owed();
