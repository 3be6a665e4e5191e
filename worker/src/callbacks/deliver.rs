//! A completion callback as owed work (`crate::owed` claims it, keeps its
//! lease and records each attempt): attempts with backoff under one claim,
//! each recorded as a `callback.*` event.

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{CallbackAttempt, CallbackJob, Store, StoreError};
use uuid::Uuid;

use super::CallbackSettings;
use super::send::{self, Request, Sent};
use crate::owed::{Owed, Settled};
use crate::retry::{Policy, RetryAfter};

/// The longest `Retry-After` honoured; a receiver asking for more gets its
/// next attempt after this long (holding a lease for hours helps nobody).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Owed callbacks: each attempt recorded, and the next one made under the
/// same claim after a backoff (a receiver's `Retry-After` honoured).
#[derive(Clone)]
pub(super) struct Callbacks {
    pub settings: Arc<CallbackSettings>,
    pub store: Store,
}

impl Owed for Callbacks {
    type Claim = CallbackJob;
    type Outcome = Sent;
    type End = CallbackAttempt;
    const WHAT: &'static str = "callback";

    fn lease(&self) -> Duration {
        self.settings.lease
    }
    fn run_id(job: &CallbackJob) -> Uuid {
        job.run.id
    }
    fn attempts_before(job: &CallbackJob) -> u32 {
        job.attempts
    }
    async fn claim(&self, run_id: Option<Uuid>) -> Result<Option<CallbackJob>, StoreError> {
        self.store.claim_callback_of(run_id, self.settings.lease).await
    }
    async fn extend(&self, job: &CallbackJob) -> Result<bool, StoreError> {
        self.store.extend_callback(job, self.settings.lease).await
    }
    async fn attempt(&self, job: &CallbackJob, _number: u32) -> Sent {
        let event = format!("run.{}", job.run.status.as_str());
        // Signed with the owner's key, so only the owner can verify it and
        // no other tenant (holding a key of its own) can forge it.
        let key = kiln_protocol::callback::subject_key(self.settings.secret.bytes(), &job.owner);
        let request = Request {
            url: &job.url,
            run: &job.run,
            owner: &job.owner,
            event: &event,
            delivery_id: job.delivery_id,
            key: &key,
            allow_private: self.settings.allow_private,
            timeout: self.settings.timeout,
        };
        send::attempt(&request).await
    }
    fn settle(&self, job: &CallbackJob, attempt: u32, sent: Sent) -> Settled<CallbackAttempt> {
        settle(&self.settings, job, attempt, sent)
    }
    async fn end(&self, job: &CallbackJob, outcome: &CallbackAttempt, event: &EventBody) -> Result<bool, StoreError> {
        self.store.record_callback_attempt(job, *outcome, event).await
    }
    async fn release(&self, job: &CallbackJob) -> Result<(), StoreError> {
        self.store.release_callback(job).await
    }
}

/// What attempt number `attempt` comes to: delivered, another attempt
/// after a backoff, or given up.
fn settle(settings: &CallbackSettings, job: &CallbackJob, attempt: u32, sent: Sent) -> Settled<CallbackAttempt> {
    let run_id = job.run.id;
    let delivery_id = job.delivery_id.to_string();
    match sent {
        Sent::Delivered { status } => {
            tracing::info!(%run_id, attempt, status, "callback delivered");
            let event = EventBody::CallbackSucceeded { attempt, status, delivery_id };
            Settled::once(CallbackAttempt::Delivered, event)
        }
        Sent::Failed { status, error, retryable, retry_after } => {
            // Attempts made before this one, by any worker, count.
            let wait = if retryable {
                policy(settings).schedule_after(attempt.saturating_sub(1)).next_delay(retry_after)
            } else {
                None
            };
            let (end, error) = match wait {
                Some(_) => (CallbackAttempt::WillRetry, error),
                None if retryable => (CallbackAttempt::GaveUp, format!("{error}; gave up after {attempt} attempts")),
                None => (CallbackAttempt::GaveUp, error),
            };
            tracing::warn!(%run_id, attempt, ?status, %error, ?wait, "callback failed");
            let retry_in_ms = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
            let event = EventBody::CallbackFailed { attempt, status, error, delivery_id, retry_in_ms };
            Settled { end, event, again_in: wait }
        }
    }
}

/// Attempts per callback from `settings`: exponential from `base_delay`,
/// capped at `max_delay`, with jitter (receivers that failed together are
/// not hit together again), and never shorter than what the receiver asked
/// for in `Retry-After` (up to [`MAX_RETRY_AFTER`]).
fn policy(settings: &CallbackSettings) -> Policy {
    Policy::attempts(settings.max_attempts, settings.base_delay, settings.max_delay)
        .honouring(RetryAfter::Capped(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callbacks::CallbackSecret;

    fn settings() -> CallbackSettings {
        CallbackSettings::new(CallbackSecret::new(b"k").unwrap())
    }

    fn backoff(settings: &CallbackSettings, attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
        policy(settings).delay(attempt, retry_after, jitter).unwrap()
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let s = settings();
        assert_eq!(backoff(&s, 1, None, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(&s, 2, None, 1.0), Duration::from_secs(2));
        assert_eq!(backoff(&s, 4, None, 1.0), Duration::from_secs(8));
        assert_eq!(backoff(&s, 4, None, 0.5), Duration::from_secs(4));
        assert_eq!(backoff(&s, 30, None, 1.0), Duration::from_secs(60));
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_bound() {
        let s = settings();
        assert_eq!(backoff(&s, 1, Some(Duration::from_secs(30)), 1.0), Duration::from_secs(30));
        // A shorter Retry-After does not shorten the backoff.
        assert_eq!(backoff(&s, 3, Some(Duration::from_millis(10)), 1.0), Duration::from_secs(4));
        assert_eq!(backoff(&s, 1, Some(Duration::from_secs(86_400)), 1.0), MAX_RETRY_AFTER);
    }
}
