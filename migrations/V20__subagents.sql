-- Sub-agents (issue 18): a child run is a row of `runs` in its parent's
-- session, started by the parent's `task` tool call. See docs/architecture.md,
-- "Sub-agents".
ALTER TABLE runs
    ADD COLUMN parent_run_id uuid REFERENCES runs(id) ON DELETE CASCADE,
    -- The parent's call that started the child: one child per call, so a
    -- parent taken over finds the child its earlier attempt started.
    ADD COLUMN parent_call_id text,
    -- The kind of agent (`explore`, `general`) and where it sits in the
    -- tree, e.g. `main/explore[1-1]`.
    ADD COLUMN agent_kind text,
    ADD COLUMN agent_path text,
    ADD CONSTRAINT runs_child_has_call CHECK ((parent_run_id IS NULL) = (parent_call_id IS NULL));

CREATE UNIQUE INDEX runs_children ON runs (parent_run_id, parent_call_id) WHERE parent_run_id IS NOT NULL;

-- A child waiting to be taken over (its worker was lost) is queued, but only
-- its parent's next attempt picks it up: claims skip children.
DROP INDEX runs_queue;
CREATE INDEX runs_queue ON runs (priority, created_at) WHERE status = 'queued' AND parent_run_id IS NULL;
