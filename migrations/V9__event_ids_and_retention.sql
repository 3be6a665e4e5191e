-- Idempotent event appends, pruning the events of old runs, and a quota
-- check that does not grow with history (issue 6).

-- Chosen by the writer before its first attempt and kept across retries: an
-- insert whose commit succeeded but whose answer was lost (the connection
-- died) is retried with the same id and finds its row instead of storing the
-- event twice under a new seq. NULL for events written before this column
-- and for writers that never retry (the API, the reaper).
ALTER TABLE events ADD COLUMN event_id uuid;
-- Unique, so even a retry racing the original's commit cannot store a copy
-- (it fails and looks again). Partial: NULLs cost no index space.
CREATE UNIQUE INDEX events_event_id ON events (event_id) WHERE event_id IS NOT NULL;

-- When the retention task removed this run's events (all but the terminal
-- event and what followed it), so it does not look at the run again.
ALTER TABLE runs ADD COLUMN events_pruned_at timestamptz;
-- The retention task's work list: ended runs not yet pruned, oldest first.
-- Pruned runs leave the index, so it stays as small as the backlog.
CREATE INDEX runs_prunable ON runs (finished_at)
    WHERE finished_at IS NOT NULL AND events_pruned_at IS NULL;

-- The per-subject quota counts a subject's active runs on every submission;
-- this keeps that count to the active runs instead of the subject's whole
-- history (the recent-runs count uses runs_owner_created).
CREATE INDEX runs_owner_active ON runs (owner) WHERE status IN ('queued', 'running', 'awaiting_approval');
