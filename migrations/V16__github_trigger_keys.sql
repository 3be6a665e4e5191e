-- A webhook's delivery id (`X-GitHub-Delivery`) is outside its signature:
-- a captured signed body replayed under a new id would queue the run again.
-- The trigger key names the event itself from inside the signed body (the
-- comment's id; for a label, the issue, the label and the issue's
-- `updated_at`), so each event queues at most one run. NULL for runs made
-- before this column existed.
ALTER TABLE github_runs ADD COLUMN trigger_key text;
CREATE UNIQUE INDEX github_runs_trigger_key ON github_runs (trigger_key);

-- Per-repository and per-sender quotas count a window of recent runs.
CREATE INDEX github_runs_repo_created ON github_runs (repo_full_name, created_at);
CREATE INDEX github_runs_sender_created ON github_runs (sender_login, created_at);
