-- Every GitHub-triggered run that ends is owed a report on GitHub, however
-- it ended: finished by its worker, cancelled while still queued (no worker
-- ever held it), or failed by the reaper after its workers were lost. The
-- debt is recorded in the same transaction as the end itself, by a trigger,
-- so no path to a terminal status can forget it and no crash between "the
-- run ended" and "deliver it" can lose it. Workers deliver owed runs (the
-- finishing worker at once, any worker by polling).

-- `delivery_requested_at` now means "a delivery is owed since": set when the
-- run ends and by `POST /v1/runs/{id}/deliver`, cleared when an attempt ends
-- (unless it was set again during the attempt). `delivery_started_at` is
-- when the current or last attempt began.

-- The delivery in progress holds a lease instead of a bare start time: the
-- worker extends it while it works, so a live delivery is never taken over
-- (no comment posted twice at once) and a dead worker's is taken over as soon
-- as the lease runs out. `delivery_holder` fences the end of an attempt: a
-- worker that lost the lease cannot record over its successor.
ALTER TABLE github_runs ADD COLUMN delivery_holder uuid;
ALTER TABLE github_runs ADD COLUMN delivery_lease_until timestamptz;

CREATE FUNCTION kiln_github_delivery_owed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE github_runs SET delivery_requested_at = now()
    WHERE run_id = NEW.id AND delivered_at IS NULL;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_github_delivery_owed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION kiln_github_delivery_owed();
