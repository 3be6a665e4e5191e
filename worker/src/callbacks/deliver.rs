//! Delivering one claimed callback: attempts with backoff, each recorded as
//! a `callback.*` event, under a lease kept alive meanwhile.

use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{CallbackAttempt, CallbackJob, Store};
use tokio_util::sync::CancellationToken;

use super::CallbackSettings;
use super::send::{self, Request, Sent};
use crate::lease_keeper::{Beat, LeaseKeeper};
use crate::retry::{self, Policy, RetryAfter, Verdict};

/// The longest `Retry-After` honoured; a receiver asking for more gets its
/// next attempt after this long (holding a lease for hours helps nobody).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

pub async fn deliver(settings: &CallbackSettings, store: &Store, job: CallbackJob, shutdown: CancellationToken) {
    // Attempting stops if the lease is lost: another worker calls by then,
    // and two must not call at once.
    tokio::select! {
        () = attempts(settings, store, &job, &shutdown) => {}
        () = keep_lease(settings, store, &job) => {
            tracing::warn!(run_id = %job.run.id, "lost a callback's lease; another worker delivers it");
        }
    }
}

async fn attempts(settings: &CallbackSettings, store: &Store, job: &CallbackJob, shutdown: &CancellationToken) {
    let run_id = job.run.id;
    let event = format!("run.{}", job.run.status.as_str());
    let delivery_id = job.delivery_id.to_string();
    // Signed with the owner's key, so only the owner can verify it and no
    // other tenant (holding a key of its own) can forge it.
    let key = kiln_protocol::callback::subject_key(settings.secret.bytes(), &job.owner);
    let request = Request {
        url: &job.url,
        run: &job.run,
        owner: &job.owner,
        event: &event,
        delivery_id: job.delivery_id,
        key: &key,
        allow_private: settings.allow_private,
        timeout: settings.timeout,
    };
    // Attempts made by workers before this one count.
    let mut schedule = policy(settings).schedule_after(job.attempts);
    loop {
        let attempt = schedule.attempt();
        let (outcome, body, wait) = match send::attempt(&request).await {
            Sent::Delivered { status } => {
                tracing::info!(%run_id, attempt, status, "callback delivered");
                let body = EventBody::CallbackSucceeded { attempt, status, delivery_id: delivery_id.clone() };
                (CallbackAttempt::Delivered, body, None)
            }
            Sent::Failed { status, error, retryable, retry_after } => {
                let wait = if retryable { schedule.next_delay(retry_after) } else { None };
                let (outcome, error) = match wait {
                    Some(_) => (CallbackAttempt::WillRetry, error),
                    None if retryable => {
                        (CallbackAttempt::GaveUp, format!("{error}; gave up after {attempt} attempts"))
                    }
                    None => (CallbackAttempt::GaveUp, error),
                };
                tracing::warn!(%run_id, attempt, ?status, %error, ?wait, "callback failed");
                let retry_in_ms = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
                let body =
                    EventBody::CallbackFailed { attempt, status, error, delivery_id: delivery_id.clone(), retry_in_ms };
                (outcome, body, wait)
            }
        };
        if !record(store, job, outcome, &body).await {
            return;
        }
        let Some(wait) = wait else { return };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => {
                // Hand it back so another worker continues at once.
                if let Err(e) = store.release_callback(job).await {
                    tracing::warn!(%run_id, error = %e, "handing back a callback failed; its lease will run out");
                }
                return;
            }
        }
    }
}

/// Records an attempt, retrying while the database blinks. False: stop
/// (the lease is gone, or the record could not be made; past the lease
/// another worker tries again, so the receiver may hear twice).
async fn record(store: &Store, job: &CallbackJob, outcome: CallbackAttempt, body: &EventBody) -> bool {
    let recorded = retry::retry(
        &retry::DATABASE,
        || store.record_callback_attempt(job, outcome, body),
        |_| Verdict::Retry,
        |e, attempt, _| tracing::warn!(run_id = %job.run.id, error = %e, attempt, "recording a callback attempt failed"),
    )
    .await;
    match recorded {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(run_id = %job.run.id, "a callback's lease ran out before its attempt was recorded");
            false
        }
        Err(e) => {
            tracing::warn!(run_id = %job.run.id, error = %e, "recording a callback attempt failed; giving up");
            false
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

/// Extends `job`'s lease; returns once the lease is lost: taken over, or
/// about to run out because the database has not answered (given up a
/// third early, so this worker stops before another can start).
async fn keep_lease(settings: &CallbackSettings, store: &Store, job: &CallbackJob) {
    LeaseKeeper::new("callback", job.run.id, settings.lease)
        .giving_up_early(settings.lease / 3)
        .keep(|| async { store.extend_callback(job, settings.lease).await.map(Beat::extended_if) })
        .await;
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
