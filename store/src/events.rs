//! The events table: dense per-run seqs, fenced appends, paged reads.

use deadpool_postgres::GenericClient;
use kiln_protocol::{EventBody, StoredEvent};
use uuid::Uuid;

use crate::lease::Lease;
use crate::{Store, StoreError, channels};

fn split(body: &EventBody) -> Result<(String, serde_json::Value), StoreError> {
    body.clone().into_parts().map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A batch of events as the array parameters of a multi-row insert
/// (`unnest($kinds::text[], $payloads::jsonb[], $ids::uuid[])`).
pub(crate) struct EventColumns {
    pub kinds: Vec<String>,
    pub payloads: Vec<serde_json::Value>,
    pub ids: Vec<Uuid>,
}

impl EventColumns {
    pub(crate) fn of(events: &[(Uuid, EventBody)]) -> Result<Self, StoreError> {
        let mut columns = EventColumns {
            kinds: Vec::with_capacity(events.len()),
            payloads: Vec::with_capacity(events.len()),
            ids: Vec::with_capacity(events.len()),
        };
        for (id, body) in events {
            let (kind, payload) = split(body)?;
            columns.kinds.push(kind);
            columns.payloads.push(payload);
            columns.ids.push(*id);
        }
        Ok(columns)
    }
}

/// Appends an event inside a caller's transaction, unfenced: for the API and
/// the reaper, which act on a run without holding its lease. The caller has
/// already locked or checked the run row.
pub(crate) async fn insert_event_tx(
    tx: &impl GenericClient,
    run_id: Uuid,
    body: &EventBody,
) -> Result<i64, StoreError> {
    let (kind, payload) = split(body)?;
    let row = tx
        .query_one(
            "WITH bump AS (
                 UPDATE runs SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING last_event_seq
             ), ins AS (
                 INSERT INTO events (run_id, seq, kind, payload)
                 SELECT $1, last_event_seq, $2, $3 FROM bump RETURNING seq
             )
             SELECT seq, pg_notify($4, $1::text || ':' || seq) IS NULL FROM ins",
            &[&run_id, &kind, &payload, &channels::RUN_EVENTS],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The terminal kinds (`kiln_protocol::event::TERMINAL_KINDS`) as an SQL
/// list, for `kind IN terminal_kinds!()`. Written out rather than bound as
/// a parameter: the planner uses the partial index `events_terminal`
/// (migrations/V28) only for a query whose predicate implies the index's,
/// which a bound `kind = ANY($n)` does only while a prepared statement is
/// planned for its values, not in the generic plan a pooled connection
/// settles on after five executions (a test checks the list against
/// `TERMINAL_KINDS` and the migration).
macro_rules! terminal_kinds {
    () => {
        "('run.succeeded', 'run.failed', 'run.cancelled', 'run.timed_out')"
    };
}
pub(crate) use terminal_kinds;

/// The SQL of a page of a run's events (`events_page`, `open_events`):
/// the events after `$after`, at most `$limit` of them and, beyond the
/// first, at most `$max_bytes` of kind and payload together, with `more`
/// saying whether one follows. The window runs over at most `$limit` rows
/// (the inner LIMIT stops the scan) and looks one row further for `more`.
/// Sizes are the payload as text, which is never shorter than the JSON
/// served. A macro, not a function: `concat!` keeps each statement one
/// static string, prepared once per connection.
macro_rules! bounded_page {
    ($run:literal, $after:literal, $limit:literal, $max_bytes:literal) => {
        concat!(
            "SELECT seq, kind, payload, at, more FROM (
                 SELECT seq, kind, payload, at,
                        row_number() OVER w AS n,
                        sum(octet_length(kind) + octet_length(payload::text)) OVER w AS upto,
                        lead(seq) OVER w IS NOT NULL AS more
                 FROM events WHERE run_id = ",
            $run,
            " AND seq > ",
            $after,
            "
                 WINDOW w AS (ORDER BY seq)
                 ORDER BY seq LIMIT ",
            $limit,
            "
             ) bounded
             WHERE n = 1 OR upto <= ",
            $max_bytes
        )
    };
}

impl Store {
    /// Appends an event for a run this worker holds, under a fresh event id.
    /// Callers that retry a failed append should use
    /// [`Store::append_event_once`] with one id for all attempts.
    pub async fn append_event(&self, lease: &Lease, body: &EventBody) -> Result<i64, StoreError> {
        self.append_event_once(lease, Uuid::now_v7(), body).await
    }

    /// Appends an event for a run this worker holds; returns its seq. The seq
    /// bump, the insert and the notification are one statement, so seqs stay
    /// dense and a worker that lost the lease writes nothing.
    ///
    /// Idempotent in `event_id`: when an earlier attempt with the same id was
    /// committed (its answer lost with the connection), this returns that
    /// event's seq and stores nothing.
    pub async fn append_event_once(&self, lease: &Lease, event_id: Uuid, body: &EventBody) -> Result<i64, StoreError> {
        // A batch of one: the same statement, seq bump and notification.
        self.append_events_once(lease, &[(event_id, body.clone())]).await
    }

    /// Appends several events for a run this worker holds, in order, in one
    /// statement (one commit, one notification); returns the last seq.
    /// Seqs stay dense. Idempotent in the events' ids: the batch is stored
    /// all at once or not at all, so when a retry finds its first id stored,
    /// the whole batch is, and nothing is stored again.
    pub async fn append_events_once(&self, lease: &Lease, events: &[(Uuid, EventBody)]) -> Result<i64, StoreError> {
        let Some((first_id, _)) = events.first() else {
            return Err(StoreError::Corrupt("an empty batch of events".into()));
        };
        let EventColumns { kinds, payloads, ids } = EventColumns::of(events)?;
        let count = events.len() as i64;
        let client = self.client().await?;
        // Prepared once per connection: the hot path of every run.
        let statement = client
            .prepare_cached(
                "WITH earlier AS (
                     SELECT max(seq) AS seq FROM events WHERE event_id = ANY($6)
                 ), bump AS (
                     UPDATE runs SET last_event_seq = last_event_seq + $7
                     WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                       AND status IN ('running', 'awaiting_approval')
                       AND NOT EXISTS (SELECT 1 FROM events WHERE event_id = $8)
                     RETURNING last_event_seq
                 ), ins AS (
                     INSERT INTO events (run_id, seq, kind, payload, event_id)
                     SELECT $1, bump.last_event_seq - $7 + e.ord, e.kind, e.payload, e.id
                     FROM bump, unnest($4::text[], $5::jsonb[], $6::uuid[]) WITH ORDINALITY AS e(kind, payload, id, ord)
                     RETURNING seq
                 )
                 SELECT max(seq) FROM ins HAVING count(*) > 0
                 UNION ALL
                 SELECT seq FROM earlier WHERE seq IS NOT NULL",
            )
            .await?;
        let result = client
            .query_opt(
                &statement,
                &[&lease.run_id, &lease.attempt, &lease.worker, &kinds, &payloads, &ids, &count, first_id],
            )
            .await;
        let row = match result {
            Ok(row) => row,
            // The earlier attempt committed while this one ran: stored.
            Err(e) if is_duplicate_event_id(&e) => {
                client.query_opt("SELECT max(seq) FROM events WHERE event_id = ANY($1)", &[&ids]).await?
            }
            Err(e) => return Err(e.into()),
        };
        match row.map(|r| r.try_get::<_, Option<i64>>(0)).transpose()?.flatten() {
            Some(seq) => {
                // Also after a retry that found the batch stored: the first
                // attempt's notification may never have been sent.
                self.announce_event(lease.run_id, seq);
                Ok(seq)
            }
            None => Err(StoreError::LeaseLost(lease.run_id)),
        }
    }

    /// Events of a run with seq > `after`, oldest first, at most `limit`.
    pub async fn events_after(&self, run_id: Uuid, after: i64, limit: i64) -> Result<Vec<StoredEvent>, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: every stream's catch-up runs it.
        let statement = client
            .prepare_cached(
                "SELECT seq, kind, payload, at FROM events
                 WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            )
            .await?;
        let rows = client.query(&statement, &[&run_id, &after, &limit]).await?;
        rows.iter().map(|r| stored_event(r, 0)).collect()
    }

    /// Events of a run with seq > `after`, oldest first: at most `limit`
    /// of them and, beyond the first, at most `max_bytes` of kind and
    /// payload together. A single event larger than that still comes alone,
    /// so a reader always moves on; the next read continues after the last
    /// event returned. The byte bound is what keeps a page of large events
    /// (a run's output) from loading a thousand of them at once.
    pub async fn events_page(
        &self,
        run_id: Uuid,
        after: i64,
        limit: i64,
        max_bytes: i64,
    ) -> Result<EventBatch, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(concat!(bounded_page!("$1", "$2", "$3", "$4"), " ORDER BY seq")).await?;
        let rows = client.query(&statement, &[&run_id, &after, &limit, &max_bytes]).await?;
        let mut more = false;
        let events = rows
            .iter()
            .map(|r| {
                more = r.try_get(4)?;
                stored_event(r, 0)
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(EventBatch { events, more })
    }

    /// The pages of several runs in one statement: for each `(run, after)`
    /// of `reads`, in order, the page [`Store::events_page`] would read with
    /// the same bounds (each run's own `limit` and `max_bytes`). One round
    /// trip and one statement for what would be as many as there are runs:
    /// the API's feeds read their runs' news this way when notifications
    /// come together (`kiln_api::page_reads`).
    pub async fn events_pages(
        &self,
        reads: &[(Uuid, i64)],
        limit: i64,
        max_bytes: i64,
    ) -> Result<Vec<EventBatch>, StoreError> {
        let (runs, afters): (Vec<Uuid>, Vec<i64>) = reads.iter().copied().unzip();
        let client = self.client().await?;
        // `i` numbers the reads (the same run may be read twice, from two
        // places); each read's page is `events_page`'s, joined laterally.
        let statement = client
            .prepare_cached(concat!(
                "SELECT q.i, page.seq, page.kind, page.payload, page.at, page.more
                 FROM unnest($1::uuid[], $2::int8[]) WITH ORDINALITY AS q(run_id, after_seq, i)
                 CROSS JOIN LATERAL (",
                bounded_page!("q.run_id", "q.after_seq", "$3", "$4"),
                ") page
                 ORDER BY q.i, page.seq"
            ))
            .await?;
        let rows = client.query(&statement, &[&runs, &afters, &limit, &max_bytes]).await?;
        let mut pages = vec![EventBatch { events: Vec::new(), more: false }; reads.len()];
        for r in &rows {
            let i: i64 = r.try_get(0)?;
            let page = usize::try_from(i - 1)
                .ok()
                .and_then(|i| pages.get_mut(i))
                .ok_or_else(|| StoreError::Corrupt(format!("a page numbered {i} of {} reads", reads.len())))?;
            page.more = r.try_get(5)?;
            page.events.push(stored_event(r, 1)?);
        }
        Ok(pages)
    }

    /// What a stream or a JSON page of `owner`'s run needs as it opens, in
    /// one statement (one round trip instead of three: the run, its
    /// terminal event, the first page): the run's last seq, the seq of its
    /// terminal event once it has ended, and the first page after `after`,
    /// bounded as [`Store::events_page`] bounds it. `None`: no such run, or
    /// not `owner`'s (no event of it is read then).
    pub async fn open_events(
        &self,
        owner: &str,
        run_id: Uuid,
        after: i64,
        limit: i64,
        max_bytes: i64,
    ) -> Result<Option<EventsOpening>, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: every stream opens with it. The
        // page is `events_page`'s, joined laterally so it is read only for
        // the owner's run; an empty page still leaves the run's row (its
        // event columns null). The terminal event is looked up once, in
        // the materialised `r`: in the select list it was a subquery run
        // again for every row of the page (a page of 500 of an ended run's
        // 5,000 events took 0.6 s instead of 5 ms), and through
        // `events_terminal` (one probe, not a walk over the run's events).
        let statement = client
            .prepare_cached(concat!(
                "WITH r AS MATERIALIZED (
                     SELECT id, last_event_seq,
                            CASE WHEN status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                                 THEN (SELECT min(seq) FROM events
                                       WHERE run_id = runs.id AND kind IN ",
                terminal_kinds!(),
                ")
                            END AS terminal_seq
                     FROM runs WHERE id = $1 AND owner = $2
                 )
                 SELECT r.last_event_seq, r.terminal_seq,
                        page.seq, page.kind, page.payload, page.at, page.more
                 FROM r LEFT JOIN LATERAL (",
                bounded_page!("r.id", "$3", "$4", "$5"),
                ") page ON true
                 ORDER BY page.seq"
            ))
            .await?;
        let rows = client.query(&statement, &[&run_id, &owner, &after, &limit, &max_bytes]).await?;
        let Some(first) = rows.first() else { return Ok(None) };
        let mut opening = EventsOpening {
            last_event_seq: first.try_get(0)?,
            terminal_seq: first.try_get(1)?,
            page: EventBatch { events: Vec::with_capacity(rows.len()), more: false },
        };
        for r in &rows {
            // An empty page leaves the run's row, its event columns null.
            if r.try_get::<_, Option<i64>>(2)?.is_none() {
                continue;
            }
            opening.page.more = r.try_get(6)?;
            opening.page.events.push(stored_event(r, 2)?);
        }
        Ok(Some(opening))
    }

    /// The bytes of events the run has stored, each counted as its JSON
    /// (`{"kind":…,"payload":…}`, the worker's measure; the payload as text
    /// is never shorter than its compact JSON): what earlier attempts spent
    /// of the run's event budget. Reads every payload of the run: once per
    /// takeover.
    pub async fn run_event_bytes(&self, run_id: Uuid) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT coalesce(sum(octet_length(kind) + octet_length(payload::text) + $2), 0)::bigint
                 FROM events WHERE run_id = $1",
                &[&run_id, &EVENT_JSON_FRAME],
            )
            .await?;
        Ok(u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0))
    }
}

/// The bytes an event's JSON adds to its kind and payload:
/// `{"kind":"` + `","payload":` + `}`.
const EVENT_JSON_FRAME: i32 = 22;

/// The event in a row's columns `seq, kind, payload, at`, the first at
/// `from`: how every read of the events table returns its events.
fn stored_event(r: &tokio_postgres::Row, from: usize) -> Result<StoredEvent, StoreError> {
    Ok(StoredEvent {
        seq: r.try_get(from)?,
        kind: r.try_get(from + 1)?,
        payload: r.try_get(from + 2)?,
        at: r.try_get(from + 3)?,
    })
}

/// A bounded read of a run's events ([`Store::events_page`]).
#[derive(Debug, Clone)]
pub struct EventBatch {
    pub events: Vec<StoredEvent>,
    /// The run has events after the last one here (the read stopped at its
    /// count or byte bound, not at the end).
    pub more: bool,
}

/// A run's events as a reader opens them ([`Store::open_events`]).
#[derive(Debug, Clone)]
pub struct EventsOpening {
    /// The seq of the run's last event: no resume point beyond it exists.
    pub last_event_seq: i64,
    /// The seq of the run's terminal event, once the run has ended
    /// (retention keeps that event): a stream ends there.
    pub terminal_seq: Option<i64>,
    /// The first page of events after the resume point.
    pub page: EventBatch,
}

pub(crate) fn is_duplicate_event_id(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION && db.constraint() == Some("events_event_id")
    })
}

impl Store {
    /// Appends an event to a run that has ended, without a lease: what the
    /// worker reports after the end (`deliver.git`'s outcome). Nothing is
    /// written for a run that has not ended.
    pub async fn append_after_end(&self, run_id: Uuid, body: &EventBody) -> Result<Option<i64>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let ended = tx
            .query_opt(
                "SELECT 1 FROM runs WHERE id = $1 AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                 FOR UPDATE",
                &[&run_id],
            )
            .await?;
        if ended.is_none() {
            return Ok(None);
        }
        let seq = insert_event_tx(&tx, run_id, body).await?;
        tx.commit().await?;
        Ok(Some(seq))
    }
}

#[cfg(test)]
mod tests {
    use kiln_protocol::event::TERMINAL_KINDS;

    /// The kinds of `terminal_kinds!`, in order.
    fn listed() -> Vec<String> {
        terminal_kinds!()
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(|k| k.trim().trim_matches('\'').to_owned())
            .collect()
    }

    #[test]
    fn the_sql_list_of_terminal_kinds_is_the_protocols() {
        assert_eq!(listed(), TERMINAL_KINDS);
    }

    #[test]
    fn the_terminal_index_is_built_over_the_same_list() {
        // The planner matches a query's predicate with the index's as text
        // of the same expression: the migration must list the same kinds.
        let migration = include_str!("../../migrations/V28__terminal_event_index.sql");
        assert!(
            migration.contains(concat!("WHERE kind IN ", terminal_kinds!(), ";")),
            "migrations/V28 lists other kinds than terminal_kinds!()"
        );
    }
}
