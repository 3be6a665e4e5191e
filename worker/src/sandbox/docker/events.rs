//! The engine's news of Kiln's containers stopping: one subscription to
//! Docker's event stream per backend (so per worker), filtered on the
//! engine's side to the `die`, `oom` and `destroy` of containers carrying
//! Kiln's label, told to every toolbox connection through a [`StopHub`].
//!
//! A stream that ends or fails is opened again after a pause that doubles
//! up to [`MAX_PAUSE`]; meanwhile the hub is down (connections ask the
//! engine themselves). Each new stream starts a little before the old one
//! ended (`since`, the engine replays what it kept), and coming up tells
//! the connections to ask once anyway: the engine's clock may differ from
//! ours, and it keeps only so much.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::models::EventMessage;
use bollard::query_parameters::EventsOptionsBuilder;
use futures::StreamExt;
use tokio::task::AbortHandle;

use crate::labels::LABEL_MANAGED;
use crate::sandbox::backend::Stopped;
use crate::sandbox::stops::{SandboxStop, StopHub};

/// The first pause before opening the stream again, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// A stream that lasted this long was healthy: the next failure pauses
/// from [`FIRST_PAUSE`] again.
const HEALTHY_FOR: Duration = Duration::from_secs(60);
/// How far back a new stream starts: news the old one may not have
/// delivered before it broke.
const REPLAY: Duration = Duration::from_secs(5);

/// The running subscription; dropped with the last clone of its backend.
#[derive(Debug)]
pub(super) struct Subscription {
    pub hub: Arc<StopHub>,
    task: AbortHandle,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Subscribes to the engine's events on the current runtime.
pub(super) fn subscribe(docker: Docker) -> Subscription {
    let hub = Arc::new(StopHub::default());
    let task = tokio::spawn(follow(docker, hub.clone())).abort_handle();
    Subscription { hub, task }
}

/// Marks the hub down when the task following the stream ends, however
/// it ends (aborted with its backend, panicked, its runtime shut down):
/// listeners trust a hub that is up, and would never ask the engine again.
struct DownOnDrop(Arc<StopHub>);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        self.0.set_up(false);
    }
}

/// Keeps a stream open, for as long as the backend lives.
async fn follow(docker: Docker, hub: Arc<StopHub>) {
    let _down = DownOnDrop(hub.clone());
    let mut pause = FIRST_PAUSE;
    let mut since = unix_now().saturating_sub(REPLAY.as_secs());
    loop {
        let opened = Instant::now();
        let why = stream(&docker, &hub, since).await;
        hub.set_up(false);
        since = unix_now().saturating_sub(REPLAY.as_secs());
        if opened.elapsed() >= HEALTHY_FOR {
            pause = FIRST_PAUSE;
        }
        tracing::warn!(reason = %why, retry_in = ?pause, "the engine's event stream ended; sandboxes are polled meanwhile");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// One stream from `since` (unix seconds), until it ends: why it did.
async fn stream(docker: &Docker, hub: &StopHub, since: u64) -> String {
    let filters = HashMap::from([
        ("type", vec!["container".to_owned()]),
        ("event", vec!["die".to_owned(), "oom".to_owned(), "destroy".to_owned()]),
        ("label", vec![format!("{LABEL_MANAGED}=true")]),
    ]);
    let options = EventsOptionsBuilder::new().since(&since.to_string()).filters(&filters).build();
    let mut events = docker.events(Some(options));
    // Up from the request on: what happens before the engine has it
    // registered comes back through `since`.
    hub.set_up(true);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if let Some(stop) = stop_of(&event) {
                    hub.stopped(stop);
                }
            }
            Err(e) => return e.to_string(),
        }
    }
    "the engine closed it".to_owned()
}

/// The stop an event tells of, if it does.
fn stop_of(event: &EventMessage) -> Option<SandboxStop> {
    let actor = event.actor.as_ref()?;
    let attributes = actor.attributes.as_ref();
    let said = |key: &str| attributes.and_then(|a| a.get(key));
    let how = match event.action.as_deref()? {
        "die" => Stopped { exit_code: said("exitCode").and_then(|c| c.parse().ok()), ..Stopped::default() },
        "oom" => Stopped { oom_killed: true, ..Stopped::default() },
        "destroy" => Stopped { removed: true, ..Stopped::default() },
        _ => return None,
    };
    Some(SandboxStop { id: actor.id.clone()?, name: said("name").cloned(), how })
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use bollard::models::EventActor;

    use super::*;

    fn event(action: &str, attributes: &[(&str, &str)]) -> EventMessage {
        let attributes = attributes.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        EventMessage {
            action: Some(action.into()),
            actor: Some(EventActor { id: Some("c1".into()), attributes: Some(attributes) }),
            ..EventMessage::default()
        }
    }

    /// Waits (a while at most) until the feed is `up`, or not.
    async fn until_up(feed: &crate::sandbox::stops::StopFeed, up: bool) -> bool {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while feed.is_up() != up {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        waited.await.is_ok()
    }

    #[tokio::test]
    async fn the_feed_goes_down_with_its_task_aborted_or_panicked() {
        let subscription = subscribe(Docker::connect_with_local_defaults().unwrap());
        let feed = subscription.hub.subscribe();
        assert!(until_up(&feed, true).await, "the stream was asked for");
        drop(subscription);
        assert!(until_up(&feed, false).await, "still up with nobody following the engine");

        let hub = Arc::new(StopHub::default());
        let feed = hub.subscribe();
        let guarded = DownOnDrop(hub.clone());
        let task = tokio::spawn(async move {
            let _down = guarded;
            hub.set_up(true);
            panic!("a bug while following");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert!(!feed.is_up(), "still up after the task panicked");
    }

    #[test]
    fn die_oom_and_destroy_are_stops_and_say_how() {
        let die = stop_of(&event("die", &[("exitCode", "137"), ("name", "kiln-session-x")])).unwrap();
        let stopped = Stopped { exit_code: Some(137), ..Stopped::default() };
        assert_eq!(die, SandboxStop { id: "c1".into(), name: Some("kiln-session-x".into()), how: stopped });
        assert!(stop_of(&event("oom", &[])).unwrap().how.oom_killed);
        assert!(stop_of(&event("destroy", &[])).unwrap().how.removed);
        assert_eq!(stop_of(&event("start", &[])), None);
    }
}
