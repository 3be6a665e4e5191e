-- An ended run's terminal event, found by an index probe (issue 33). Every
-- stream and JSON page of an ended run opens by asking where the run ended
-- (`Store::open_events`), and the retention task asks it of every run it
-- prunes; through the primary key (run_id, seq) that is a walk over the
-- run's events up to the terminal one, which is at the end: linear in the
-- run's length (3-4 ms at 5,000 events, for every page a reader asks for).
--
-- Partial: a run has one terminal event, so the index holds one entry per
-- ended run and costs nothing on the appends of a running one. The kinds are
-- `kiln_protocol::event::TERMINAL_KINDS`, written out as the queries that
-- use the index write them (`terminal_kinds!`, store/src/events.rs): the
-- planner uses a partial index only when a query's own predicate implies
-- the index's, which a bound `kind = ANY($n)` does only in a plan made for
-- its values, not in the generic plan a long-lived connection settles on.
--
-- Built inside the migration's transaction, so it blocks appends while it
-- scans the events table once: on a large deployment, expect the upgrade to
-- take as long as one sequential read of that table.
CREATE INDEX events_terminal ON events (run_id, seq)
    WHERE kind IN ('run.succeeded', 'run.failed', 'run.cancelled', 'run.timed_out');
