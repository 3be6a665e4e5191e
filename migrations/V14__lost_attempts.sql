-- A run fails after its worker was *lost* `max_attempts` times, not after it
-- was claimed that often: a graceful release (SIGTERM, a deploy) hands the
-- run back on purpose and must not use up its attempts. `attempt` still
-- counts claims (it fences every write of a holder); `losses` counts reaps.
ALTER TABLE runs ADD COLUMN losses integer NOT NULL DEFAULT 0;

-- Runs under way keep what the old rule gave them: every earlier claim
-- counted as a loss.
UPDATE runs SET losses = GREATEST(attempt - 1, 0) WHERE status IN ('queued', 'running', 'awaiting_approval');
