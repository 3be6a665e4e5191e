//! The queue's SQL, written once: the claim of queued runs and the end of a
//! held run, put together into the statements the queue sends (the claim,
//! the finish, the finish-and-claim of `queue`, the ends sent together of
//! `end_batch`). Each statement is rendered once per process and prepared
//! once per connection, so building them from parts costs nothing per run.
//!
//! Parameters are numbered by the statement that uses a part, so each part
//! takes the placeholders (or the columns) it reads as arguments.

use crate::rows::RUN_RETURNING;

/// The oldest queued runs, highest priority first: at most `limit` of them,
/// locked for the claim; runs another claim has locked are skipped, not
/// waited for.
fn queued(limit: &str) -> String {
    format!(
        "SELECT id FROM runs WHERE status = 'queued' AND parent_run_id IS NULL
         ORDER BY priority, created_at FOR UPDATE SKIP LOCKED LIMIT {limit}"
    )
}

/// The claim: the runs `target` picks (an id test on [`queued`]) start, or
/// start again, under `worker` with a lease of `lease_ms` milliseconds
/// (float8). Answers the columns `run_from_row` reads.
fn claim(worker: &str, lease_ms: &str, target: &str) -> String {
    format!(
        "UPDATE runs r SET status = 'running', attempt = attempt + 1, lease_owner = {worker},
                lease_expires_at = now() + {lease_ms} * interval '1 millisecond',
                started_at = COALESCE(started_at, now())
         WHERE {target}
         RETURNING {RUN_RETURNING}"
    )
}

/// What ending a run writes into its row: the terminal status, its result
/// and error, the lease let go, and the seq its terminal event takes.
fn finish_set(status: &str, result: &str, error: &str) -> String {
    format!(
        "status = {status}, finished_at = now(), result = {result}, error = {error},
         lease_owner = NULL, lease_expires_at = NULL, last_event_seq = last_event_seq + 1"
    )
}

/// The ends' terminal events, one per row of `fin` (which answers `id`,
/// `last_event_seq` and, as `kind` and `payload` name them, the event).
fn terminal_events(kind: &str, payload: &str, returning: &str) -> String {
    format!(
        "INSERT INTO events (run_id, seq, kind, payload)
         SELECT id, last_event_seq, {kind}, {payload} FROM fin RETURNING {returning}"
    )
}

/// The end of one held run, as the `fin` and `ins` parts of a statement:
/// `$1` run, `$2` attempt, `$3` worker (the fence), `$4` status, `$5`
/// result, `$6` error, `$7` kind and `$8` payload of the terminal event.
/// `fin` says whether the end owes a follow-up (`follow_ups`).
fn finish_one() -> String {
    format!(
        "fin AS (
             UPDATE runs SET {set}
             WHERE id = $1 AND attempt = $2 AND lease_owner = $3
               AND status IN ('running', 'awaiting_approval')
             RETURNING id, last_event_seq, follow_up_owed
         ), ins AS (
             {events}
         )",
        set = finish_set("$4", "$5", "$6"),
        events = terminal_events("$7", "$8", "seq"),
    )
}

/// The claim statement (`$1` worker, `$2` lease in milliseconds as float8).
/// Public so the queue benchmark's baseline runs exactly this SQL.
pub fn claim_statement() -> String {
    claim("$1", "$2", &format!("id = ({})", queued("1")))
}

/// The finish statement (parameters as `finish_one`). Answers the terminal
/// event's seq and whether the end owes a follow-up (no row: the lease was
/// lost). Public for the queue benchmark's baseline.
pub fn finish_statement() -> String {
    format!("WITH {} SELECT ins.seq, fin.follow_up_owed FROM ins, fin", finish_one())
}

/// [`finish_statement`] and, when the run could be finished, the claim of
/// the next queued run for `$9` (lease `$10` ms): the ending run's worker
/// takes its next run in the same commit. Answers one row when the finish
/// happened: the claimed run (all NULL when none was queued), then the
/// terminal event's seq (`ended_seq`) and `follow_up_owed`.
pub fn finish_and_claim_statement() -> String {
    format!(
        "WITH {}, next AS (
             {}
         )
         SELECT next.*, ins.seq AS ended_seq, fin.follow_up_owed FROM ins CROSS JOIN fin LEFT JOIN next ON true",
        finish_one(),
        claim("$9", "$10", &format!("id = ({}) AND EXISTS (SELECT 1 FROM fin)", queued("1"))),
    )
}

/// [`finish_and_claim_statement`] for many runs (`$1`..`$8` arrays, one
/// element per run): each end fenced by its own lease, its terminal event,
/// then one claim per run that ended. Answers one row per claimed run (or
/// one row of NULLs when none was), each with the ended runs (`ids`), their
/// terminal events' seqs (`seqs`) and the ended runs that owe a follow-up
/// (`owed`).
pub(crate) fn end_together_statement() -> String {
    format!(
        "WITH ends AS (
             SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::jsonb[], $6::text[],
                                  $7::text[], $8::jsonb[])
                 AS e(id, attempt, worker, status, result, error, kind, payload)
         ), fin AS (
             -- The fence: a worker's name is on a run only while the run is
             -- active (running or awaiting approval) at that attempt. Not
             -- written as a status test, which would steer the planner to
             -- the partial lease index instead of the primary key.
             UPDATE runs r SET {set}
             FROM ends e
             WHERE r.id = e.id AND r.attempt = e.attempt AND r.lease_owner = e.worker AND r.finished_at IS NULL
             RETURNING r.id, r.last_event_seq, r.follow_up_owed, e.kind, e.payload
         ), ins AS (
             {events}
         ), next AS (
             {next}
         )
         SELECT next.*, ended.ids, ended.seqs, ended.owed
         FROM (SELECT array_agg(run_id) AS ids, array_agg(seq) AS seqs,
                      (SELECT array_agg(id) FROM fin WHERE follow_up_owed) AS owed
               FROM ins) ended
         LEFT JOIN next ON true",
        set = finish_set("e.status", "e.result", "e.error"),
        events = terminal_events("kind", "payload", "run_id, seq"),
        next = claim("$9", "$10", &format!("id = ANY(ARRAY({}))", queued("(SELECT count(*) FROM fin)"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements as they were written out by hand before they were put
    /// together from parts, whitespace aside: the same SQL goes to the
    /// database (the benchmarks in `bench/` measured these).
    #[test]
    fn the_claim_reads_as_written_in_every_statement() {
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let claim = "UPDATE runs r SET status = 'running', attempt = attempt + 1, lease_owner = $1, \
             lease_expires_at = now() + $2 * interval '1 millisecond', started_at = COALESCE(started_at, now()) \
             WHERE id = (SELECT id FROM runs WHERE status = 'queued' AND parent_run_id IS NULL \
             ORDER BY priority, created_at \
             FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING ";
        assert_eq!(flat(&claim_statement()), flat(&format!("{claim}{RUN_RETURNING}")));
        let next = flat(&claim.replace("$1", "$9").replace("$2", "$10"));
        let next = next.replace("LIMIT 1)", "LIMIT 1) AND EXISTS (SELECT 1 FROM fin)");
        assert!(flat(&finish_and_claim_statement()).contains(&next));
        let batch = flat(&claim.replace("$1", "$9").replace("$2", "$10"))
            .replace("id = (SELECT", "id = ANY(ARRAY(SELECT")
            .replace("LIMIT 1)", "LIMIT (SELECT count(*) FROM fin)))");
        assert!(flat(&end_together_statement()).contains(&batch));
    }
}
