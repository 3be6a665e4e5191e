-- A run's change (issue 28): what the run did to its workspace, captured in
-- the sandbox when the run ends, whatever the end. See docs/architecture.md,
-- "A run's change".

-- Where a run's change is taken from, recorded when the run's workspace is
-- known (a fresh checkout, or the session's container a follow-up or a
-- takeover continues in), so an attempt that takes the run over diffs from
-- the same place. `base`/`session_base` are what git diffs from inside the
-- sandbox (a commit, the previous run's captured tree, or the empty tree);
-- `*_commit` the repository commit a client applies the patch to (NULL: no
-- repository).
CREATE TABLE run_change_bases (
    run_id uuid PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    session_id uuid NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    base text NOT NULL,
    base_commit text,
    session_base text NOT NULL,
    session_base_commit text,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX run_change_bases_session ON run_change_bases (session_id, recorded_at);

-- The captured change: the run's own (`run`, from its base) and the
-- session's so far (`session`, from the session's first base). `patch` is
-- what `git apply` takes; NULL when it was over `KILN_MAX_PATCH_MB`
-- (`too_large`: the per-file summary is kept, never a truncated patch).
CREATE TABLE run_changes (
    run_id uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    scope text NOT NULL CHECK (scope IN ('run', 'session')),
    base_commit text,
    -- The tree the workspace was left at (an object in the sandbox's capture
    -- store), which the session's next run diffs from.
    tree text,
    files jsonb NOT NULL,
    file_count bigint NOT NULL,
    additions bigint NOT NULL,
    deletions bigint NOT NULL,
    patch bytea,
    patch_bytes bigint NOT NULL,
    too_large boolean NOT NULL,
    captured_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, scope),
    CHECK (too_large = (patch IS NULL))
);

-- One capture path: GitHub delivery reads the run's change from
-- `run_changes` now.
ALTER TABLE github_runs DROP COLUMN patch;
