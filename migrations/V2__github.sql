-- Runs triggered from GitHub, and what each webhook delivery came to.

-- Why Kiln acted (or did not) on a delivery: 'run', 'ping' or
-- 'ignored: <reason>'. For operators reading the table; nothing branches on it.
ALTER TABLE webhook_deliveries ADD COLUMN outcome text;

-- Where a GitHub-triggered run came from, so the worker can report back
-- (react, comment, open or update a pull request). A table of its own rather
-- than columns on `runs`: most runs are not from GitHub, and these columns are
-- typed and indexable.
CREATE TABLE github_runs (
    run_id           uuid PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    -- The delivery that created the run (also in webhook_deliveries.run_id).
    -- No foreign key: deliveries may be pruned long before runs are.
    delivery_id      text NOT NULL UNIQUE,
    -- `issue_comment` or `issues`.
    event            text NOT NULL,
    -- `owner/name`.
    repo_full_name   text NOT NULL,
    -- The issue, or the pull request when the comment was on one (GitHub
    -- numbers both from one sequence).
    issue_number     bigint NOT NULL,
    -- Set when the run is about a pull request. The webhook does not carry
    -- the PR's head branch; the worker resolves it from this number.
    pr_number        bigint,
    -- The comment that asked for the run; NULL when a label did.
    comment_id       bigint,
    -- GitHub App installation to authenticate as; NULL for plain webhooks.
    installation_id  bigint,
    -- Who asked: the comment's author or the user who added the label.
    sender_login     text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- "Is Kiln already working on this issue?" looks runs up by issue.
CREATE INDEX github_runs_issue ON github_runs (repo_full_name, issue_number);
