-- A subject's quota check as a function, so that a submission can take the
-- subject's lock, count and insert in one statement (issue 33). Before, the
-- lock was taken by the first statement of a transaction and held through
-- the count, the insert, the read-back and the commit: one subject's
-- submissions went one at a time, several round trips each.
--
-- Why a function: under READ COMMITTED a statement sees the database as of
-- its start, so a count in the submission's own statement would miss a
-- submission that committed while this one waited for the lock, and two
-- could slip under the limit. A VOLATILE function's queries each take a
-- fresh snapshot: the count below runs after the lock is granted and sees
-- every submission that held it before (a transaction's locks are released
-- only after its commit is visible).
--
-- The lock is the one the check always took (class 7 of
-- `hashtextextended`), transaction-scoped: a caller in an explicit
-- transaction (a group of attempts, a follow-up) holds it to its commit.
CREATE FUNCTION kiln_quota_check(subject text)
    RETURNS TABLE (active_runs bigint, recent_runs bigint, retry_after_s float8)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(subject, 7));
    -- Two index lookups (runs_owner_active, runs_owner_created) that touch
    -- only the subject's active and recent runs: the cost of a submission
    -- must not grow with the subject's finished history.
    RETURN QUERY
        SELECT (SELECT count(*) FROM runs a
                WHERE a.owner = subject AND a.status IN ('queued', 'running', 'awaiting_approval')),
               count(*),
               EXTRACT(EPOCH FROM (min(r.created_at) + interval '1 minute' - now()))::float8
        FROM runs r WHERE r.owner = subject AND r.created_at > now() - interval '1 minute';
END $$;
