//! Submissions that arrive together are admitted together.
//!
//! A quota'd submission is one statement that takes its subject's lock
//! (`kiln_quota_check`, migrations/V29), counts, inserts and commits:
//! exactness needs each submission to see the runs admitted before it, so
//! the lock is held through the commit. One at a time, a subject's
//! submissions would go one commit (a WAL flush) apart, whatever the
//! database could do beside them (`bench/`, submit, one subject).
//!
//! Here the submissions that arrive while a line's statements are under way
//! wait in that line and go together in its next statement: one commit for
//! all of them, each admitted in its turn as if it were alone (the n-th of
//! a subject in a statement is counted after the n − 1 before it). A
//! submission that arrives alone goes at once. A counted subject has a line
//! of its own (one lock and one count for its statement); submissions with
//! no limit to count take no lock, so every subject's share one line: with
//! no quota, one commit serves many subjects as it serves many runs of one.
//!
//! The statements run in tasks of their own, so a client that goes away
//! mid-request cancels nobody else's submission. A statement that fails is
//! retried one submission at a time, so one bad submission fails only
//! itself; the run ids are chosen before the first try, so a retry of a
//! statement that did commit cannot insert a run twice (the primary key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kiln_protocol::Run;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::queued::{ADMISSION_COUNTS_AT, ADMIT_TOGETHER, Candidate, QuotaCounts, QuotaLimits};
use crate::rows::run_from_row;
use crate::{Store, StoreError};

/// A line's statements under way at once, per process: two, so that the
/// next one already waits for the subject's lock in the database while the
/// one before it commits (and so a burst holds at most two connections).
const IN_FLIGHT: usize = 2;
/// Most submissions in one statement.
const MAX_BATCH: usize = 64;

/// What the quota check said of one submission.
pub(crate) enum Verdict {
    /// Admitted and queued: the run as inserted.
    Admitted(Box<Run>),
    /// Refused: the subject's runs as counted for this submission (those
    /// admitted before it in the same statement included).
    Refused(QuotaCounts),
    /// Admitted, but its idempotency key was taken by a run committed
    /// meanwhile: nothing inserted.
    KeyTaken,
}

type Answer = Result<Verdict, StoreError>;

struct Waiting {
    candidate: Candidate,
    limits: QuotaLimits,
    reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Line {
    waiting: Vec<Waiting>,
    in_flight: usize,
}

/// Which line a submission waits in.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum LineKey {
    /// A subject whose quota is counted: its lock serialises its
    /// statements, so they are its own.
    Subject(String),
    /// Submissions with nothing to count, whatever their subject: no lock,
    /// so nothing keeps them apart.
    Unlimited,
}

impl LineKey {
    fn of(owner: &str, limits: QuotaLimits) -> Self {
        match limits.counted() {
            [None, None] => LineKey::Unlimited,
            _ => LineKey::Subject(owner.to_owned()),
        }
    }
}

/// Every line in this process. A line with nothing waiting and nothing
/// under way has no entry.
#[derive(Default)]
pub(crate) struct AdmissionLines {
    lines: Mutex<HashMap<LineKey, Line>>,
    /// Submissions between their arrival and their answer (waiting in a
    /// line or in a statement), however each ends: what `/metrics` says
    /// of the admission's backlog.
    under_way: AtomicUsize,
}

/// One submission counted in [`AdmissionLines::under_way`] until dropped:
/// answered, or abandoned by a client that went away.
struct UnderWay<'a>(&'a AtomicUsize);

impl<'a> UnderWay<'a> {
    fn count(under_way: &'a AtomicUsize) -> Self {
        under_way.fetch_add(1, Ordering::Relaxed);
        UnderWay(under_way)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AdmissionLines {
    /// Submissions in this process between their arrival and their answer.
    pub(crate) fn under_way(&self) -> usize {
        self.under_way.load(Ordering::Relaxed)
    }

    /// Admits or refuses `candidate`, a first run, under `limits`: in the
    /// next statement of its line.
    pub(crate) async fn admit(&self, store: &Store, limits: QuotaLimits, candidate: Candidate) -> Answer {
        let _counted = UnderWay::count(&self.under_way);
        let key = LineKey::of(candidate.owner(), limits);
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lines = self.lock();
            let line = lines.entry(key.clone()).or_default();
            line.waiting.push(Waiting { candidate, limits, reply });
            let start = line.in_flight < IN_FLIGHT;
            line.in_flight += usize::from(start);
            start
        };
        if start {
            tokio::spawn(flush(store.clone(), key));
        }
        // Only a statement's task dropped without answering gets here with
        // nothing: the runtime shutting down, or the task panicking.
        answer.await.map_err(|_| {
            StoreError::Unavailable("the submission was abandoned: its statement's task ended without an answer".into())
        })?
    }

    /// Up to `MAX_BATCH` of the line's waiting submissions that share the
    /// first's limits, oldest first. When none waits, the calling task
    /// leaves the line instead, under the same lock as `admit`'s look at
    /// `in_flight`: a submission that comes after finds it gone and starts a
    /// task of its own.
    fn take_or_leave(&self, key: &LineKey) -> Option<Vec<Waiting>> {
        let mut lines = self.lock();
        let line = lines.get_mut(key)?;
        let Some(limits) = line.waiting.first().map(|w| w.limits) else {
            Self::leave(&mut lines, key);
            return None;
        };
        let (batch, kept) = std::mem::take(&mut line.waiting)
            .into_iter()
            .enumerate()
            .partition::<Vec<_>, _>(|(i, w)| *i < MAX_BATCH && w.limits == limits);
        line.waiting = kept.into_iter().map(|(_, w)| w).collect();
        Some(batch.into_iter().map(|(_, w)| w).collect())
    }

    /// One task fewer under way in the line; the line's entry goes with its
    /// last task (its waiting submissions, if any, are then told they were
    /// abandoned: only a task that ended abnormally leaves any).
    fn leave(lines: &mut HashMap<LineKey, Line>, key: &LineKey) {
        let Some(line) = lines.get_mut(key) else { return };
        line.in_flight = line.in_flight.saturating_sub(1);
        if line.in_flight == 0 {
            lines.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LineKey, Line>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One of a line's statement tasks: statements until the line is empty.
async fn flush(store: Store, key: LineKey) {
    let lines = store.admission_lines.clone();
    let mut task = InLine { lines: &lines, key: &key, left: false };
    while let Some(batch) = lines.take_or_leave(&key) {
        admit_batch(&store, batch).await;
    }
    task.left = true;
}

/// A statement task's place in its line, given up however the task ends (a
/// panic, or the runtime dropping it at shutdown), so that the line never
/// counts on a dead task.
struct InLine<'a> {
    lines: &'a AdmissionLines,
    key: &'a LineKey,
    /// Left through `take_or_leave`.
    left: bool,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if !self.left {
            AdmissionLines::leave(&mut self.lines.lock(), self.key);
        }
    }
}

/// Sends `batch`'s statement and answers each of its submissions; when the
/// statement fails, each submission alone.
async fn admit_batch(store: &Store, batch: Vec<Waiting>) {
    let limits = batch[0].limits;
    let candidates: Vec<&Candidate> = batch.iter().map(|w| &w.candidate).collect();
    match admit_together(store, limits, &candidates).await {
        Ok(verdicts) => {
            for (waiting, verdict) in batch.into_iter().zip(verdicts) {
                // A receiver gone is a client gone; its run stands.
                let _ = waiting.reply.send(Ok(verdict));
            }
        }
        Err(e) if batch.len() == 1 => {
            let _ = batch.into_iter().next().map(|w| w.reply.send(Err(e)));
        }
        // No connection to be had (the pool timed out, or the database
        // refused): nothing was sent, and each alone would wait for one
        // again, one after the other, while new submissions queue behind
        // them. Every one hears it is unavailable (503), as a lone
        // submission would.
        Err(StoreError::Unavailable(message)) => {
            for waiting in batch {
                let _ = waiting.reply.send(Err(StoreError::Unavailable(message.clone())));
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, submissions = batch.len(), "a batch of submissions failed; each goes alone");
            for waiting in batch {
                let alone = admit_together(store, waiting.limits, &[&waiting.candidate]).await;
                let answer = alone.and_then(|mut verdicts| {
                    verdicts.pop().ok_or_else(|| StoreError::Corrupt("no verdict for a submission".into()))
                });
                let _ = waiting.reply.send(answer);
            }
        }
    }
}

/// One autocommitted statement: each counted subject's lock and count, and
/// the insert of as many of each subject's `candidates` as the quota
/// admits, in their order. A verdict per candidate, in the same order.
async fn admit_together(
    store: &Store,
    limits: QuotaLimits,
    candidates: &[&Candidate],
) -> Result<Vec<Verdict>, StoreError> {
    let columns = crate::queued::CandidateColumns::of(candidates);
    let mut params: Vec<&(dyn ToSql + Sync)> = columns.params().to_vec();
    let [max_active, max_recent] = limits.counted();
    params.extend([&max_active as &(dyn ToSql + Sync), &max_recent]);
    let client = store.client().await?;
    let statement = client.prepare_cached(&ADMIT_TOGETHER).await?;
    let rows = client.query(&statement, &params).await?;
    let mut verdicts: Vec<Option<Verdict>> = candidates.iter().map(|_| None).collect();
    for row in &rows {
        let n: i64 = row.try_get(ADMISSION_COUNTS_AT + 3)?;
        let slot = usize::try_from(n - 1).ok().and_then(|i| verdicts.get_mut(i));
        let slot = slot.ok_or_else(|| StoreError::Corrupt(format!("verdict for submission {n} of a batch")))?;
        let of_subject: i64 = row.try_get(ADMISSION_COUNTS_AT + 5)?;
        *slot = Some(verdict(row, of_subject)?);
    }
    verdicts
        .into_iter()
        .map(|v| v.ok_or_else(|| StoreError::Corrupt("a submission without a verdict".into())))
        .collect()
}

/// The verdict of the `n`-th (from 1) candidate of its subject in a
/// statement, from its row.
fn verdict(row: &tokio_postgres::Row, n: i64) -> Result<Verdict, StoreError> {
    let admitted: bool = row.try_get(ADMISSION_COUNTS_AT + 4)?;
    let inserted: Option<Uuid> = row.try_get(0)?;
    Ok(match (admitted, inserted) {
        (true, Some(_)) => Verdict::Admitted(Box::new(run_from_row(row)?)),
        (true, None) => Verdict::KeyTaken,
        (false, _) => {
            let counts = QuotaCounts::from_row(row, ADMISSION_COUNTS_AT)?;
            // Counted after the n − 1 before it, as if they had come alone.
            // The first of a minute's runs may be in this very statement:
            // its minute ends a minute from now.
            let before = n - 1;
            let retry_after_s = counts.retry_after_s.or(Some(60.0).filter(|_| before > 0));
            Verdict::Refused(QuotaCounts {
                active: counts.active + before,
                recent: counts.recent + before,
                retry_after_s,
            })
        }
    })
}

impl std::fmt::Debug for AdmissionLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionLines").field("lines", &self.lock().len()).finish()
    }
}

/// Shared by the store's clones (the lines are the process's).
pub(crate) type Lines = Arc<AdmissionLines>;
