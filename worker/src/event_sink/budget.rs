//! The bytes of events one run may store, over all its attempts.
//!
//! Everything a run's events hold comes from the model and the sandbox, and
//! nothing else bounds how much of it a run produces: a run printing
//! without end would fill the events table (and every client reading it).
//! The [`EventSink`](super::EventSink) counts what it stores
//! against this budget; an event that does not fit is not stored, and
//! neither is anything after it. The loop then ends the run failed before
//! its next model call or tool batch, counting what waits for the next
//! commit as well (a step's results wait for the next model call's); the
//! terminal event is written outside the budget, so how the run ended is
//! never lost.
//!
//! An event's size is its JSON (`{"kind":…,"payload":…}`). A takeover
//! counts what earlier attempts stored from the table
//! ([`kiln_store::Store::run_event_bytes`]), which measures the same way or
//! a little more.

use std::io::Write;

use kiln_protocol::EventBody;
use uuid::Uuid;

/// The setting that sets the budget, named in the run's error.
pub const SETTING: &str = "KILN_MAX_EVENT_BYTES_PER_RUN";

#[derive(Debug, Clone)]
pub struct EventBudget {
    max: u64,
    spent: u64,
    /// An event was turned away: nothing more is stored.
    refused: bool,
}

impl EventBudget {
    /// A budget of `max` bytes of which earlier attempts spent `spent`.
    pub fn new(max: u64, spent: u64) -> Self {
        EventBudget { max, spent, refused: false }
    }

    /// No limit (tools and benchmarks that write events themselves).
    pub fn unlimited() -> Self {
        EventBudget::new(u64::MAX, 0)
    }

    /// How many of `batch`, from its start, fit, and their bytes. None once
    /// the budget turned an event away: what comes after it is not stored
    /// either, so the stored events never skip one.
    pub fn fitting(&self, batch: &[(Uuid, EventBody)]) -> (usize, u64) {
        if self.refused {
            return (0, 0);
        }
        let (n, bytes, _) = self.fit(batch.iter().map(|(_, body)| body));
        (n, bytes)
    }

    /// How many of `bodies`, from the first, fit beside what is stored,
    /// their bytes, and whether all of them did.
    fn fit<'e>(&self, bodies: impl IntoIterator<Item = &'e EventBody>) -> (usize, u64, bool) {
        let mut bytes = 0u64;
        let mut n = 0;
        for body in bodies {
            let size = size_of(body);
            if self.spent.saturating_add(bytes).saturating_add(size) > self.max {
                return (n, bytes, false);
            }
            bytes += size;
            n += 1;
        }
        (n, bytes, true)
    }

    /// Counts `bytes` as stored; `refused`: an event did not fit.
    pub fn spend(&mut self, bytes: u64, refused: bool) {
        self.spent = self.spent.saturating_add(bytes);
        self.refused |= refused;
    }

    /// Whether events are still stored (a cheap check before buffering one).
    pub fn is_open(&self) -> bool {
        !self.refused && self.spent < self.max
    }

    /// Whether every one of `waiting` (events not stored yet) fits beside
    /// what is stored.
    pub fn holds<'e>(&self, waiting: impl IntoIterator<Item = &'e EventBody>) -> bool {
        self.fit(waiting).2
    }

    /// Why the run must end: the budget is spent, or `waiting` (events
    /// buffered for the next commit) will not all fit in it.
    pub fn exhausted<'e>(&self, waiting: impl IntoIterator<Item = &'e EventBody>) -> Option<String> {
        (!self.is_open() || !self.holds(waiting)).then(|| {
            format!(
                "event budget exhausted: the run stored {} of the {} bytes of events a run may store ({SETTING}); \
                 later events were not stored",
                self.spent, self.max
            )
        })
    }
}

/// The bytes of `body` as JSON, counted without building the string.
pub fn size_of(body: &EventBody) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // An event that does not serialise cannot be stored either (the store
    // refuses it); it counts as nothing here.
    let _ = serde_json::to_writer(&mut count, body);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> (Uuid, EventBody) {
        (Uuid::now_v7(), EventBody::TextDelta { text: "x".repeat(n) })
    }

    #[test]
    fn an_events_size_is_its_json() {
        let (_, body) = text(10);
        assert_eq!(size_of(&body) as usize, serde_json::to_string(&body).unwrap().len());
    }

    #[test]
    fn a_batch_is_stored_up_to_the_first_event_that_does_not_fit_and_nothing_after() {
        let batch = [text(100), text(100), text(10)];
        let one = size_of(&batch[0].1);
        let mut budget = EventBudget::new(one + 50, 0);
        let (n, bytes) = budget.fitting(&batch);
        assert_eq!((n, bytes), (1, one), "the small third event does not jump the queue");
        budget.spend(bytes, n < batch.len());
        assert_eq!(budget.fitting(&[text(1)]), (0, 0));
        let why = budget.exhausted([]).unwrap();
        assert!(why.contains(SETTING) && why.contains(&format!("{one} of")), "{why}");
    }

    #[test]
    fn what_earlier_attempts_spent_counts() {
        let budget = EventBudget::new(1000, 1000);
        assert!(!budget.is_open());
        assert!(budget.exhausted([]).is_some());
        assert!(EventBudget::new(1000, 10).exhausted([]).is_none());
    }

    #[test]
    fn events_waiting_to_be_stored_that_will_not_fit_spend_the_budget() {
        let (_, big) = text(100);
        let (_, small) = text(10);
        let budget = EventBudget::new(size_of(&big) + size_of(&small), 0);
        assert!(budget.exhausted([&big, &small]).is_none(), "both fit, exactly");
        assert!(budget.exhausted([&big, &small, &small]).is_some());
        assert!(budget.is_open(), "nothing was turned away yet");
    }
}
