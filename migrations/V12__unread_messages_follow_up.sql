-- A message accepted for an active run (202, `message.queued`) must not be
-- dropped. The worker reads the inbox before it ends a run, but a message
-- can arrive after that last look and before the run's end commits. Such
-- messages become a follow-up run in the same session, exactly as a message
-- sent just after the end would have (see `Store::send_message`), in the
-- transaction that ends the run, whoever ends it, so no crash in between
-- can lose them. A cancel ends the conversation: a cancelled run's unread
-- messages stay unread.
--
-- The trigger runs only for runs that were ever sent a message while active
-- (`steered`): ending a run is the queue's hot path, and a trigger call on
-- every end cost 10-25 % of its throughput.
ALTER TABLE runs ADD COLUMN steered boolean NOT NULL DEFAULT false;

-- A time-ordered (version 7) uuid, as the Rust side makes run ids.
CREATE FUNCTION kiln_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- Queues a follow-up of run `source_run` in its session, asking `question`; the
-- one place a follow-up is made (also `Store::send_message`). It continues
-- the same task: whoever asked to be called back when the run ended hears
-- of the follow-up's end too.
CREATE FUNCTION kiln_queue_follow_up(source_run uuid, question text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    follow_up uuid := kiln_uuid_v7();
BEGIN
    INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, trigger, policy, callback_url,
                      last_event_seq)
    SELECT follow_up, r.session_id, r.owner, 'queued', question, r.model, r.limits, 'api', r.policy,
           r.callback_url, 1
    FROM runs r WHERE r.id = source_run;
    INSERT INTO events (run_id, seq, kind, payload)
    VALUES (follow_up, 1, 'run.queued', jsonb_build_object('prompt', question));
    -- Wakes workers at once (they also poll).
    PERFORM pg_notify('kiln_runs_queued', follow_up::text);
    RETURN follow_up;
END;
$$;

CREATE FUNCTION kiln_follow_up_unread_messages() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    texts text[];
BEGIN
    WITH taken AS (
        UPDATE run_inbox SET consumed_at = now()
        WHERE run_id = NEW.id AND consumed_at IS NULL
        RETURNING id, text
    )
    SELECT array_agg(text ORDER BY id) INTO texts FROM taken;
    IF texts IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM kiln_queue_follow_up(NEW.id, array_to_string(texts, E'\n\n'));
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_follow_up_unread_messages
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.steered
          AND NEW.status IN ('succeeded', 'failed', 'timed_out')
          AND OLD.status IN ('running', 'awaiting_approval'))
    EXECUTE FUNCTION kiln_follow_up_unread_messages();
