-- The trigger that marks a GitHub run's delivery as owed (V7) ran its
-- function, and an UPDATE of github_runs, at the end of every run. Only runs
-- started from GitHub have a github_runs row (trigger = 'github'), so the
-- others now skip it: a run's end is on the queue's hot path.
DROP TRIGGER runs_github_delivery_owed ON runs;

CREATE TRIGGER runs_github_delivery_owed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.trigger = 'github')
    EXECUTE FUNCTION kiln_github_delivery_owed();
