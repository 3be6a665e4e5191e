-- Best-of-N attempts (issue 29): a run submitted with `"attempts": N` is a
-- group, and its N attempts are runs of their own (each its own session and
-- sandbox) pointing at it. See docs/architecture.md, "Attempts".
ALTER TABLE runs
    -- On an attempt: its group, and which of the group's attempts it is (1..N).
    ADD COLUMN group_run_id uuid REFERENCES runs(id) ON DELETE CASCADE,
    ADD COLUMN attempt_number integer,
    -- On a group: how many attempts it has, and the one chosen as its
    -- result (`POST /v1/runs/{id}/select`), whose change the group's is.
    ADD COLUMN attempt_count integer,
    ADD COLUMN selected_attempt integer,
    ADD CONSTRAINT runs_attempt_has_group CHECK ((group_run_id IS NULL) = (attempt_number IS NULL)),
    ADD CONSTRAINT runs_attempt_count CHECK (attempt_count IS NULL OR attempt_count BETWEEN 1 AND 16),
    ADD CONSTRAINT runs_selected_attempt CHECK (
        selected_attempt IS NULL OR (attempt_count IS NOT NULL AND selected_attempt BETWEEN 1 AND attempt_count));

CREATE UNIQUE INDEX runs_attempts ON runs (group_run_id, attempt_number) WHERE group_run_id IS NOT NULL;
