-- The quota check given its limits (issue 33), so that what it reads is
-- bounded by them and not by the subject's history.
--
-- V27's check counted every active run of the subject and every run it made
-- in the last minute: a subject with 10,000 queued runs paid ~5 ms of index
-- reads per submission (0.7 ms with five), and a deployment with quotas
-- out of reach (the `submit` benchmark's) spent most of a submission's
-- database time counting. A limit of N needs only to know whether N are
-- there: each count stops at its limit (`LIMIT`), and the oldest run of
-- the minute (for `Retry-After`) is one probe of `runs_owner_created`.
--
-- A NULL limit is no limit, and is not counted (its count answers 0); with
-- neither limit there is nothing to count and the subject's lock is not
-- taken either. V27's one-argument check stays for API processes of the
-- previous release while a deployment rolls over.
CREATE FUNCTION kiln_quota_check(subject text, max_active bigint, max_recent bigint)
    RETURNS TABLE (active_runs bigint, recent_runs bigint, retry_after_s float8)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF max_active IS NULL AND max_recent IS NULL THEN
        RETURN QUERY SELECT 0::bigint, 0::bigint, NULL::float8;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(subject, 7));
    -- As in V27, each query below takes a snapshot after the lock is granted.
    RETURN QUERY SELECT
        CASE WHEN max_active IS NULL THEN 0::bigint ELSE (
            SELECT count(*) FROM (
                SELECT 1 FROM runs a
                WHERE a.owner = subject AND a.status IN ('queued', 'running', 'awaiting_approval')
                LIMIT max_active) counted_active)
        END,
        CASE WHEN max_recent IS NULL THEN 0::bigint ELSE (
            SELECT count(*) FROM (
                SELECT 1 FROM runs r
                WHERE r.owner = subject AND r.created_at > now() - interval '1 minute'
                LIMIT max_recent) counted_recent)
        END,
        -- The oldest run of the minute, by `ORDER BY … LIMIT 1` rather than
        -- `min()`: Postgres may plan `min()` as an aggregate over the whole
        -- range, which is the count again.
        CASE WHEN max_recent IS NULL THEN NULL::float8 ELSE (
            SELECT EXTRACT(EPOCH FROM (oldest.created_at + interval '1 minute' - now()))::float8
            FROM (SELECT r.created_at FROM runs r
                  WHERE r.owner = subject AND r.created_at > now() - interval '1 minute'
                  ORDER BY r.created_at LIMIT 1) oldest)
        END;
END $$;
