//! Runs of one worker that end together are finished together.
//!
//! A run's end is one statement (`finish_run_and_claim`: the terminal status,
//! the terminal event, the claim of the worker's next run). When many of a
//! worker's runs end at once (more than `IN_FLIGHT` under way), they wait
//! behind the statements in flight and then go as one statement with one
//! commit: the ends, their events and as many claims as runs ended. A commit and a statement cost the
//! database far more than the rows they carry (measured in `bench/`, queue),
//! so this is what lets a busy worker end and start runs about as fast as
//! the database can claim them.
//!
//! A run that ends alone goes at once, through the one-run statement: a
//! batch only forms behind statements in flight, so nobody waits for a
//! batch to fill. Every caller gets its own answer: its run's end is fenced
//! by its own lease, and a batch that fails is retried one run at a time, so
//! one bad end never fails its batch-mates.
//!
//! The caller whose end goes first sends the statement itself (no task in
//! between: on a busy machine every hand-over between tasks costs a
//! scheduling delay, which showed in the benchmark), then hands the lead to
//! the oldest waiting end together with the ends that will share its
//! statement. A leader dropped mid-statement (its task aborted at the end
//! of a shutdown) still hands the lead on; its batch-mates are told their
//! statement was abandoned and may have committed, which is the truth.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::lease::{Lease, millis, terminal_parts};
use crate::queue_sql::end_together_statement;
use crate::rows::run_from_row;
use crate::{Store, StoreError};

/// Statements in flight at once while ends wait: two, so that one batch
/// forms while the other is on the wire. Few statements carrying many ends
/// each is what the database does fastest (`bench/`, queue, 16 slots).
const IN_FLIGHT_WITH_BACKLOG: usize = 2;
/// Statements in flight at once while at most this many ends are under way.
/// A worker with a few slots never builds much of a batch (its runs end one
/// by one), so its ends go at once, side by side, rather than wait behind
/// one another (faster than two in flight at 4 slots: `bench/README.md`,
/// queue, session 4).
const IN_FLIGHT: usize = 4;
/// Most runs ended in one statement.
const MAX_BATCH: usize = 32;

/// What one run's end asks for.
pub(crate) struct End {
    pub lease: Lease,
    pub terminal: EventBody,
    pub result: Option<serde_json::Value>,
    pub next_worker: String,
    pub next_lease: Duration,
}

impl End {
    /// Ends claim for one worker and lease per statement.
    fn shares_statement_with(&self, other: &End) -> bool {
        self.next_worker == other.next_worker && self.next_lease == other.next_lease
    }
}

type Answer = Result<Option<(Run, Lease)>, StoreError>;

/// What a waiting end is told.
enum Reply {
    /// Its statement ran: here is its answer.
    Answer(Box<Answer>),
    /// It sends the next statement: its own end and these.
    Lead(Box<End>, Vec<Waiting>),
}

struct Waiting {
    end: End,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
pub(crate) struct EndBatcher {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Ends under way: waiting, or in a statement.
    ends: usize,
    waiting: VecDeque<Waiting>,
    /// Statements on their way (each has one leader).
    in_flight: usize,
}

impl EndBatcher {
    /// Ends `end`'s run: at once when few statements are on their way (see
    /// `IN_FLIGHT`), else with whatever waits when it is its turn to lead.
    pub(crate) async fn end(&self, store: &Store, end: End) -> Answer {
        let run_id = end.lease.run_id;
        let (reply, told) = oneshot::channel();
        let _counted = Counted::new(self);
        let lead = {
            let mut state = self.lock();
            let go_now =
                state.in_flight < IN_FLIGHT_WITH_BACKLOG || (state.in_flight < IN_FLIGHT && state.ends <= IN_FLIGHT);
            if go_now {
                state.in_flight += 1;
                Some(end)
            } else {
                state.waiting.push_back(Waiting { end, reply });
                None
            }
        };
        let (own, others) = match lead {
            Some(own) => {
                let others = take_batch(&mut self.lock().waiting, &own);
                (own, others)
            }
            None => match told.await {
                Ok(Reply::Answer(answer)) => return *answer,
                Ok(Reply::Lead(own, others)) => (*own, others),
                // The leader's task was dropped mid-statement.
                Err(_) => {
                    return Err(StoreError::Unavailable(format!(
                        "the statement ending run {run_id} was abandoned; it may have committed"
                    )));
                }
            },
        };
        // From here this task leads one statement; the guard passes the lead
        // on (or frees the slot) however this future ends.
        let _lead = Leading(self);
        send(store, own, others).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Held by the task sending a statement. Dropped (statement done, or the
/// task cancelled), it hands the lead to the oldest waiting end, with the
/// ends that will share its statement, or frees the slot when none waits.
struct Leading<'a>(&'a EndBatcher);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        // With a backlog, fewer statements carry more ends each: above
        // `IN_FLIGHT_WITH_BACKLOG`, the statements still in flight take the
        // waiting ends when they are done.
        if state.in_flight > IN_FLIGHT_WITH_BACKLOG && state.ends > IN_FLIGHT {
            state.in_flight -= 1;
            return;
        }
        while let Some(next) = state.waiting.pop_front() {
            let others = take_batch(&mut state.waiting, &next.end);
            match next.reply.send(Reply::Lead(Box::new(next.end), others)) {
                Ok(()) => return,
                // That caller stopped waiting: its end goes with it, as if
                // it had been dropped before asking; the others wait again.
                Err(Reply::Lead(_, others)) => {
                    for (i, w) in others.into_iter().enumerate() {
                        state.waiting.insert(i, w);
                    }
                }
                Err(Reply::Answer(_)) => {}
            }
        }
        state.in_flight -= 1;
    }
}

/// Counts an end as under way for as long as its caller waits for it.
struct Counted<'a>(&'a EndBatcher);

impl<'a> Counted<'a> {
    fn new(batcher: &'a EndBatcher) -> Self {
        batcher.lock().ends += 1;
        Counted(batcher)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.lock().ends -= 1;
    }
}

/// Up to `MAX_BATCH - 1` waiting ends that can share `own`'s statement,
/// oldest first.
fn take_batch(waiting: &mut VecDeque<Waiting>, own: &End) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let mut i = 0;
    while i < waiting.len() && batch.len() + 1 < MAX_BATCH {
        if waiting[i].end.shares_statement_with(own) {
            batch.extend(waiting.remove(i));
        } else {
            i += 1;
        }
    }
    batch
}

/// Ends `own` and `others` (one statement when there are others), answers
/// the others, and returns `own`'s answer.
async fn send(store: &Store, own: End, others: Vec<Waiting>) -> Answer {
    if !others.is_empty() {
        let ends: Vec<&End> = std::iter::once(&own).chain(others.iter().map(|w| &w.end)).collect();
        match end_together(store, &ends).await {
            Ok(mut answers) => {
                let mine = answers.remove(0);
                for (w, answer) in others.into_iter().zip(answers) {
                    let _ = w.reply.send(Reply::Answer(Box::new(answer)));
                }
                return mine;
            }
            Err(e) => {
                tracing::warn!(error = %e, runs = ends.len(), "ending runs together failed; ending them one at a time");
            }
        }
    }
    for w in others {
        let answer = store.finish_run_and_claim_alone(&w.end).await;
        let _ = w.reply.send(Reply::Answer(Box::new(answer)));
    }
    store.finish_run_and_claim_alone(&own).await
}

/// Built once, like the queue's other statements (`queue_sql`).
static END_TOGETHER: std::sync::LazyLock<String> = std::sync::LazyLock::new(end_together_statement);

/// Ends `batch` in one statement; the answers are in `batch`'s order.
async fn end_together(store: &Store, batch: &[&End]) -> Result<Vec<Answer>, StoreError> {
    let n = batch.len();
    let (mut ids, mut attempts, mut workers) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut statuses, mut results, mut errors) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut kinds, mut payloads) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for w in batch {
        let (status, error, kind, payload) = terminal_parts(&w.terminal)?;
        ids.push(w.lease.run_id);
        attempts.push(w.lease.attempt);
        workers.push(w.lease.worker.as_str());
        statuses.push(status.as_str());
        results.push(w.result.clone());
        errors.push(error);
        kinds.push(kind);
        payloads.push(payload);
    }
    let next_worker = batch[0].next_worker.as_str();
    let next_lease = millis(batch[0].next_lease);

    let client = store.client().await?;
    let statement = client.prepare_cached(&END_TOGETHER).await?;
    let rows = client
        .query(
            &statement,
            &[&ids, &attempts, &workers, &statuses, &results, &errors, &kinds, &payloads, &next_worker, &next_lease],
        )
        .await?;
    drop(client);

    let Some(first) = rows.first() else { return Err(StoreError::Corrupt("ending runs answered no row".into())) };
    let ended: Vec<Uuid> = first.try_get::<_, Option<Vec<Uuid>>>("ids")?.unwrap_or_default();
    let seqs: Vec<i64> = first.try_get::<_, Option<Vec<i64>>>("seqs")?.unwrap_or_default();
    let owed: Vec<Uuid> = first.try_get::<_, Option<Vec<Uuid>>>("owed")?.unwrap_or_default();
    let seq_of: HashMap<Uuid, i64> = ended.into_iter().zip(seqs).collect();
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        if row.try_get::<_, Option<Uuid>>(0)?.is_some() {
            claimed.push(run_from_row(row)?);
        }
    }

    // Before anyone is answered: whoever ended a run finds its follow-up
    // queued, as with a run ended alone.
    store.queue_owed_follow_ups(&owed).await;
    let mut claimed = claimed.into_iter();
    let answers = batch
        .iter()
        .map(|w| {
            let run_id = w.lease.run_id;
            let Some(&seq) = seq_of.get(&run_id) else { return Err(StoreError::LeaseLost(run_id)) };
            store.announce_event(run_id, seq);
            Ok(claimed.next().map(|run| {
                let lease = Lease { run_id: run.id, attempt: run.attempt, worker: next_worker.to_owned() };
                (run, lease)
            }))
        })
        .collect();
    Ok(answers)
}
