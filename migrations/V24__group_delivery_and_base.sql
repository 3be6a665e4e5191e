-- A group of attempts with `deliver.git` (issue 29) pushes its chosen
-- attempt's change. The choice is made through the API, which holds no git
-- credentials, so the push is owed here and made by a worker: claimed with a
-- lease (a dead worker's claim runs out and another takes it), and once it
-- is claimed or made the choice can no longer change
-- (`POST /v1/runs/{id}/select` answers 409).
CREATE TABLE group_git_deliveries (
    run_id        uuid PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    -- Set by a choice; cleared when a delivery ends, either way (a failed
    -- one is owed again by the next choice).
    owed          boolean NOT NULL DEFAULT true,
    -- The worker making it, and until when its claim holds.
    holder        uuid,
    claimed_until timestamptz,
    delivered_at  timestamptz
);

CREATE INDEX group_git_deliveries_owed ON group_git_deliveries (run_id) WHERE owed;

-- All attempts of a group start from the same commit, however the branch
-- moves between their checkouts: the first attempt to check out records
-- the commit it got here; every later one checks out this commit.
ALTER TABLE runs ADD COLUMN group_base_commit text;
