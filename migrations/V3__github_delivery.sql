-- What the worker needs to report a GitHub-triggered run back (issue 5,
-- delivery half), kept in the database rather than on one worker's disk so
-- that any worker can retry a delivery after the sandbox is gone.

-- Set once the worker has acknowledged the trigger (👀 or "working on it"),
-- so a run that is retried after a lost lease does not acknowledge twice.
ALTER TABLE github_runs ADD COLUMN acked_at timestamptz;
-- The branch and commit the workspace was cloned at: the patch applies to
-- this commit and the pull request targets this branch.
ALTER TABLE github_runs ADD COLUMN base_ref text;
ALTER TABLE github_runs ADD COLUMN base_sha text;
-- `git diff --cached --binary HEAD` of /workspace when the run succeeded
-- (empty: no changes). NULL until captured.
ALTER TABLE github_runs ADD COLUMN patch bytea;
-- A delivery (re)try asked for through `POST /v1/runs/{id}/deliver`; workers
-- poll for these.
ALTER TABLE github_runs ADD COLUMN delivery_requested_at timestamptz;
-- Held while a worker delivers, so the end of the run and a retry request do
-- not deliver at once; a stale one (a worker died) is taken over.
ALTER TABLE github_runs ADD COLUMN delivery_started_at timestamptz;
-- The pull request opened for the run, so a retry does not open a second one.
ALTER TABLE github_runs ADD COLUMN pr_url text;
-- Set when the result was reported on the issue; a delivered run is not
-- delivered again.
ALTER TABLE github_runs ADD COLUMN delivered_at timestamptz;

CREATE INDEX github_runs_delivery_requested ON github_runs (delivery_requested_at)
    WHERE delivery_requested_at IS NOT NULL;
