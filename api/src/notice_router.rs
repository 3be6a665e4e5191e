//! Routes the LISTEN connection's notifications to the runs they name, once
//! per API instance: a notification costs one map lookup and wakes only the
//! reader of its run (`crate::feed`). Each reader used to read the
//! listener's broadcast itself, so every notification woke every reader to
//! compare a prefix: with 1,000 followed runs and one event per run per
//! step, a million wake-ups per step (issue 33's events bench over 1,000
//! runs, 2.2× the plain server's p50).
//!
//! A notification is a hint; the table stays the truth. When the listener
//! reconnected, or this router fell behind its broadcast, anything may have
//! been missed, so every reader is woken to read. Readers also poll
//! (`ApiSettings::sse_poll`), which covers a router that stopped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use kiln_store::{Listener, Notice, channels};
use tokio::sync::Notify;
use tokio::sync::broadcast::{self, error::RecvError};
use uuid::Uuid;

/// The wake-ups of the readers, by run. A `Vec`: a retiring reader may
/// still be registered when its successor registers for the same run.
type Table = Mutex<HashMap<Uuid, Vec<Arc<Wake>>>>;

fn lock(table: &Table) -> MutexGuard<'_, HashMap<Uuid, Vec<Arc<Wake>>>> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// One API instance's router. Holds the LISTEN connection open for as long
/// as it lives; its task ends with it.
pub struct NoticeRouter {
    table: Arc<Table>,
    /// Keeps the LISTEN connection open (`None` in tests fed by hand).
    _listener: Option<Listener>,
}

impl std::fmt::Debug for NoticeRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoticeRouter").field("runs", &lock(&self.table).len()).finish()
    }
}

impl NoticeRouter {
    /// Routes `listener`'s notifications. Spawns the routing task, so it
    /// must be called within a Tokio runtime.
    pub fn new(listener: Listener) -> Self {
        let mut router = Self::on(listener.subscribe());
        router._listener = Some(listener);
        router
    }

    /// Routes the notices of `notices` (the listener's broadcast, or a
    /// test's).
    fn on(notices: broadcast::Receiver<Notice>) -> Self {
        let table = Arc::new(Table::default());
        tokio::spawn(route(notices, Arc::downgrade(&table)));
        NoticeRouter { table, _listener: None }
    }

    /// Registers a reader of `run`: from now on, the run's notifications
    /// (and every reconnect or lag) wake it. Register before the first read
    /// of the table, so nothing committed after that read goes unannounced.
    pub fn register(&self, run: Uuid) -> Registration {
        let wake = Arc::new(Wake::default());
        lock(&self.table).entry(run).or_default().push(wake.clone());
        Registration { table: Arc::downgrade(&self.table), run, wake }
    }
}

/// What the router sets for one reader.
#[derive(Debug, Default)]
struct Wake {
    notify: Notify,
    /// The highest seq announced for the run: a reader that has read it
    /// skips the query (its read after a notification often takes the
    /// events announced during that read along).
    announced: AtomicI64,
    /// Anything may have been missed (reconnect, lag, an unreadable seq):
    /// the reader reads whatever it has.
    unsure: AtomicBool,
}

impl Wake {
    fn announce(&self, seq: Option<i64>) {
        match seq {
            Some(seq) => {
                self.announced.fetch_max(seq, Ordering::SeqCst);
            }
            None => self.unsure.store(true, Ordering::SeqCst),
        }
        // Stores a permit when the reader is not waiting: it is not lost.
        self.notify.notify_one();
    }
}

/// A reader's place in the router; dropping it unregisters.
#[derive(Debug)]
pub struct Registration {
    table: Weak<Table>,
    run: Uuid,
    wake: Arc<Wake>,
}

impl Registration {
    /// The highest seq announced for the run so far.
    pub fn announced(&self) -> i64 {
        self.wake.announced.load(Ordering::SeqCst)
    }

    /// Waits until an event after `after` is announced, anything may have
    /// been missed, or `poll` passed.
    pub async fn news_after(&self, after: i64, poll: Duration) {
        let deadline = tokio::time::sleep(poll);
        tokio::pin!(deadline);
        loop {
            if self.wake.unsure.swap(false, Ordering::SeqCst) || self.wake.announced.load(Ordering::SeqCst) > after {
                return;
            }
            tokio::select! {
                _ = &mut deadline => return,
                _ = self.wake.notify.notified() => {}
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(table) = self.table.upgrade() else { return };
        let mut runs = lock(&table);
        if let Some(wakes) = runs.get_mut(&self.run) {
            wakes.retain(|w| !Arc::ptr_eq(w, &self.wake));
            if wakes.is_empty() {
                runs.remove(&self.run);
            }
        }
    }
}

/// The routing task: until the router or the listener is gone.
async fn route(mut notices: broadcast::Receiver<Notice>, table: Weak<Table>) {
    loop {
        let notice = notices.recv().await;
        let Some(table) = table.upgrade() else { return };
        match notice {
            Ok(Notice::Notification { channel, payload }) if channel == channels::RUN_EVENTS => {
                let Some((run, seq)) = parse(&payload) else { continue };
                if let Some(wakes) = lock(&table).get(&run) {
                    wakes.iter().for_each(|w| w.announce(seq));
                }
            }
            Ok(Notice::Notification { .. }) => {}
            Ok(Notice::Reconnected) | Err(RecvError::Lagged(_)) => {
                lock(&table).values().flatten().for_each(|w| w.announce(None));
            }
            // The listener is gone: readers poll.
            Err(RecvError::Closed) => return,
        }
    }
}

/// A `run_events` payload, `<run>:<seq>`: the run, and the seq if it reads
/// as one (without it the run's reader reads anyway). `None`: no run named.
fn parse(payload: &str) -> Option<(Uuid, Option<i64>)> {
    let (run, seq) = payload.split_once(':').unwrap_or((payload, ""));
    Some((run.parse().ok()?, seq.parse().ok()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Long enough that only a wake-up ends a wait.
    const NEVER: Duration = Duration::from_secs(3600);

    fn notice(run: Uuid, seq: &str) -> Notice {
        Notice::Notification { channel: channels::RUN_EVENTS.into(), payload: format!("{run}:{seq}") }
    }

    /// Whether `reg` is woken for news after `after` within 300 ms (the
    /// router's task runs meanwhile).
    async fn woken(reg: &Registration, after: i64) -> bool {
        tokio::time::timeout(Duration::from_millis(300), reg.news_after(after, NEVER)).await.is_ok()
    }

    fn router() -> (broadcast::Sender<Notice>, NoticeRouter) {
        let (tx, rx) = broadcast::channel(16);
        (tx, NoticeRouter::on(rx))
    }

    #[tokio::test]
    async fn a_notice_wakes_the_reader_of_its_run_and_no_other() {
        let (tx, router) = router();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let (reg_a, reg_b) = (router.register(a), router.register(b));
        tx.send(notice(a, "3")).unwrap();
        assert!(woken(&reg_a, 2).await, "A's reader is woken by A's notice");
        assert!(!woken(&reg_b, 0).await, "B's reader is not woken by A's notice");
        assert_eq!(reg_a.announced(), 3);
    }

    #[tokio::test]
    async fn a_reader_that_has_the_announced_event_is_not_woken() {
        let (tx, router) = router();
        let a = Uuid::now_v7();
        let reg = router.register(a);
        tx.send(notice(a, "5")).unwrap();
        tx.send(notice(a, "4")).unwrap();
        assert!(!woken(&reg, 5).await, "seq 5 was read already");
        assert!(woken(&reg, 4).await);
    }

    #[tokio::test]
    async fn a_notice_without_a_readable_seq_wakes_its_run_anyway() {
        let (tx, router) = router();
        let a = Uuid::now_v7();
        let reg = router.register(a);
        tx.send(notice(a, "x")).unwrap();
        assert!(woken(&reg, 100).await);
        assert!(!woken(&reg, 100).await, "the wake-up is used up");
    }

    #[tokio::test]
    async fn a_reconnect_wakes_every_reader() {
        let (tx, router) = router();
        let regs: Vec<_> = (0..3).map(|_| router.register(Uuid::now_v7())).collect();
        tx.send(Notice::Reconnected).unwrap();
        for reg in &regs {
            assert!(woken(reg, 100).await);
        }
    }

    #[tokio::test]
    async fn a_router_that_fell_behind_wakes_every_reader() {
        let (tx, rx) = broadcast::channel(2);
        let router = NoticeRouter::on(rx);
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let (reg_a, reg_b) = (router.register(a), router.register(b));
        // Sent before the router's task runs (this test's runtime has one
        // thread): the oldest are lost, among them the one naming B.
        tx.send(notice(b, "1")).unwrap();
        for seq in 1..=4 {
            tx.send(notice(a, &seq.to_string())).unwrap();
        }
        assert!(woken(&reg_b, 100).await, "B may have missed a notice: woken");
        assert!(woken(&reg_a, 100).await);
    }

    #[tokio::test]
    async fn two_readers_of_one_run_are_both_woken_and_unregister_alone() {
        let (tx, router) = router();
        let a = Uuid::now_v7();
        let (first, second) = (router.register(a), router.register(a));
        tx.send(notice(a, "1")).unwrap();
        assert!(woken(&first, 0).await && woken(&second, 0).await);
        drop(first);
        tx.send(notice(a, "2")).unwrap();
        assert!(woken(&second, 1).await, "the other's unregistering left this one");
        drop(second);
        assert!(lock(&router.table).is_empty(), "the run's entry goes with its last reader");
    }

    #[test]
    fn payloads_parse_as_run_and_seq() {
        let run = Uuid::now_v7();
        assert_eq!(parse(&format!("{run}:42")), Some((run, Some(42))));
        assert_eq!(parse(&format!("{run}")), Some((run, None)));
        assert_eq!(parse("not-a-run:1"), None);
    }
}
