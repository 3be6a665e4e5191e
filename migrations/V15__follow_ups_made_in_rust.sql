-- A follow-up run is queued by the Rust code that queues every run
-- (`store/src/queued.rs`, `store/src/follow_ups.rs`), no longer by plpgsql
-- of its own (V12's `kiln_queue_follow_up`, with its own uuid v7): a run's
-- row and its `run.queued` event are defined once.
--
-- What stays in the database is the durable part: the transaction that ends
-- a run, whoever ends it, marks it as owing a follow-up when it was sent
-- messages it did not read (`follow_up_owed`); the messages stay in its
-- inbox. Whoever ended the run queues the follow-up just after, and clears
-- the mark in that commit; the reaper sweeps up marks a stopped process
-- left. A message accepted with 202 is still never lost, and a cancelled
-- run still owes nothing (a cancel ends the conversation).
--
-- As in V12, the trigger runs only for runs that were sent a message while
-- active (`steered`): ending a run is the queue's hot path.
ALTER TABLE runs ADD COLUMN follow_up_owed boolean NOT NULL DEFAULT false;

-- The sweep looks up the runs still owing one (almost always none).
CREATE INDEX runs_owing_follow_up ON runs (id) WHERE follow_up_owed;

DROP TRIGGER runs_follow_up_unread_messages ON runs;
DROP FUNCTION kiln_follow_up_unread_messages();
DROP FUNCTION kiln_queue_follow_up(uuid, text);
DROP FUNCTION kiln_uuid_v7();

-- BEFORE, so the mark is written with the end itself (no second update of
-- the row) and the statement that ends the run answers it (RETURNING).
CREATE FUNCTION kiln_mark_follow_up_owed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.follow_up_owed := EXISTS (SELECT 1 FROM run_inbox WHERE run_id = NEW.id AND consumed_at IS NULL);
    RETURN NEW;
END;
$$;

CREATE TRIGGER runs_follow_up_owed
    BEFORE UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.steered
          AND NEW.status IN ('succeeded', 'failed', 'timed_out')
          AND OLD.status IN ('running', 'awaiting_approval'))
    EXECUTE FUNCTION kiln_mark_follow_up_owed();
