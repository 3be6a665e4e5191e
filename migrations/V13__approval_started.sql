-- When the worker let an approved call through to run. A takeover must know
-- whether a call that waited for a person may have run: one never let
-- through certainly did not, and goes through the approval gate again
-- instead of being answered "interrupted".
ALTER TABLE approvals ADD COLUMN started_at timestamptz;
