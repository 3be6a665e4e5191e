-- A group of attempts a GitHub comment asked for (`/kiln --attempts N`,
-- issue 29) has one `github_runs` row, the group's; its attempts have none
-- and take their origin from it. The group's report goes through the same
-- owed delivery as a single run's (V7): when the group ends it owes a
-- summary of the attempts; a choice (`POST /v1/runs/{id}/select`, or a
-- `/kiln select K` comment) owes it again, and that delivery opens the pull
-- request with the chosen attempt's change.
ALTER TABLE github_runs
    -- The deployment took the first attempt to succeed as the group's
    -- choice when the group was made (`KILN_GITHUB_ATTEMPTS_TAKE_FIRST`).
    ADD COLUMN take_first_success boolean NOT NULL DEFAULT false,
    -- Who chose the attempt through a comment: the worker checks their
    -- access to the repository before it pushes (NULL: chosen through the
    -- API by the runs' owner, or by the deployment's setting).
    ADD COLUMN selected_by text;

-- While a worker holds a GitHub-triggered group's delivery (its lease) and
-- the group has a choice, the choice can no longer change: the worker may
-- be pushing it (`POST /v1/runs/{id}/select` answers 409). A choice made
-- while a delivery only reports the attempts (there was none yet) owes the
-- delivery again, and the next one pushes it.
