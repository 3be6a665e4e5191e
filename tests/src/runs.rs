//! Typed helpers for behaviour tests: a run is submitted as a
//! [`CreateRun`] and read back as a [`Run`], its events arrive decoded as
//! [`EventBody`]. The shapes are the protocol's own, so a test asserts on
//! fields the compiler knows. Tests of the wire contract keep the JSON
//! helpers (`create_run`, `get_run`, `sse`), which show the bytes as sent.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kiln_cli::client::StreamedEvent;
use kiln_protocol::{CreateRun, EventBody, Run, RunStatus, StoredEvent};
use serde::Deserialize;
use uuid::Uuid;

use crate::{Ev, Seen, TestApp, token};

/// One event as a client saw it over SSE, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub body: EventBody,
    /// The SSE `event:` field, which the body was decoded with.
    kind: String,
}

impl Event {
    /// Decodes a streamed event; a kind or payload this build does not
    /// know fails the test.
    fn decode(event: StreamedEvent) -> Event {
        let body = event.body().unwrap_or_else(|| panic!("an event this build cannot decode: {event:?}"));
        Event { seq: event.seq, body, kind: event.kind }
    }

    /// The event's kind as the API names it (`run.succeeded`).
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl From<Ev> for Event {
    fn from(e: Ev) -> Event {
        Event::decode(StreamedEvent { seq: e.seq, kind: e.kind, payload: e.data })
    }
}

impl From<StoredEvent> for Event {
    fn from(e: StoredEvent) -> Event {
        Event::decode(StreamedEvent { seq: e.seq, kind: e.kind, payload: e.payload })
    }
}

impl Seen for Event {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn kind(&self) -> &str {
        &self.kind
    }
}

/// How the run the events belong to ended: the status its last event ends
/// it in, `None` if the last event (or no event) ends nothing.
pub fn outcome(events: &[Event]) -> Option<RunStatus> {
    events.last().and_then(|e| e.body.terminal_status())
}

impl TestApp {
    /// Submits a run as `sub`; the API must answer 201 with the run.
    pub async fn submit(&self, sub: &str, spec: CreateRun) -> Run {
        let r = self.http.post(self.url("/v1/runs")).bearer_auth(token(sub)).json(&spec).send().await.unwrap();
        assert_eq!(r.status(), 201, "create run");
        r.json().await.expect("a run")
    }

    /// The run as `sub` sees it; the API must answer 200.
    pub async fn run(&self, sub: &str, id: Uuid) -> Run {
        let r = self.http.get(self.url(&format!("/v1/runs/{id}"))).bearer_auth(token(sub)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.expect("a run")
    }

    /// Follows the run from its first event to its end on this app's API.
    pub async fn events(&self, sub: &str, run: Uuid) -> Vec<Event> {
        self.events_on(self.addr, sub, run, None, usize::MAX).await
    }

    /// Follows the run to its end on this app's API, starting after
    /// `last_event_id`.
    pub async fn events_after(&self, sub: &str, run: Uuid, last_event_id: Option<i64>) -> Vec<Event> {
        self.events_on(self.addr, sub, run, last_event_id, usize::MAX).await
    }

    /// Follows the run on this app's API, starting after `last_event_id`,
    /// until its end or the first event `stop` accepts.
    pub async fn events_until(
        &self,
        sub: &str,
        run: Uuid,
        last_event_id: Option<i64>,
        stop: impl Fn(&Event) -> bool,
    ) -> Vec<Event> {
        self.read_sse(self.addr, sub, &run.to_string(), last_event_id, usize::MAX, stop).await
    }

    /// Reads the run's events over SSE from `addr` until its end (or `max`
    /// events), starting after `last_event_id`.
    pub async fn events_on(
        &self,
        addr: SocketAddr,
        sub: &str,
        run: Uuid,
        last_event_id: Option<i64>,
        max: usize,
    ) -> Vec<Event> {
        self.read_sse(addr, sub, &run.to_string(), last_event_id, max, |_: &Event| false).await
    }

    /// The run's events after `after` as one page of the events route's
    /// JSON form (`?after=`) shows them now; the route must answer 200.
    pub async fn events_page(&self, sub: &str, run: Uuid, after: i64) -> Vec<Event> {
        #[derive(Deserialize)]
        struct Page {
            events: Vec<StoredEvent>,
        }
        let r = self
            .http
            .get(self.url(&format!("/v1/runs/{run}/events?after={after}")))
            .bearer_auth(token(sub))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "events page");
        let page: Page = r.json().await.expect("a page of events");
        page.events.into_iter().map(Event::from).collect()
    }

    /// The run's events as the store holds them now, including those after
    /// its terminal event (deliveries, callbacks), where the SSE stream ends.
    pub async fn stored_events(&self, run: Uuid) -> Vec<Event> {
        self.store.events_after(run, 0, 10_000).await.expect("read events").into_iter().map(Event::from).collect()
    }

    /// Waits (up to 90 s) until the store holds an event of `kind` for the
    /// run, then returns all its events so far.
    pub async fn wait_for_event(&self, run: Uuid, kind: &str) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let events = self.stored_events(run).await;
            if events.iter().any(|e| e.kind() == kind) {
                return events;
            }
            assert!(Instant::now() < deadline, "no {kind} event; got {:?}", crate::kinds(&events));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The events whose body matches `$pattern`, each as `$value`, as an
/// iterator: `pick!(events, EventBody::ToolResult { output, .. } => output)`.
#[macro_export]
macro_rules! pick {
    ($events:expr, $pattern:pat => $value:expr) => {
        $events.iter().filter_map(|e: &$crate::Event| match &e.body {
            $pattern => Some($value),
            _ => None,
        })
    };
}
