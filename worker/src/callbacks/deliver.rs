//! Delivering one claimed callback: attempts with backoff, each recorded as
//! a `callback.*` event, under a lease kept alive meanwhile.

use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{CallbackAttempt, CallbackJob, Store};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::CallbackSettings;
use super::send::{self, Request, Sent};

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
    let request = Request {
        url: &job.url,
        run: &job.run,
        event: &event,
        delivery_id: job.delivery_id,
        secret: settings.secret.bytes(),
        allow_private: settings.allow_private,
        timeout: settings.timeout,
    };
    let mut attempt = job.attempts;
    loop {
        attempt += 1;
        let (outcome, body, wait) = match send::attempt(&request).await {
            Sent::Delivered { status } => {
                tracing::info!(%run_id, attempt, status, "callback delivered");
                let body = EventBody::CallbackSucceeded { attempt, status, delivery_id: delivery_id.clone() };
                (CallbackAttempt::Delivered, body, None)
            }
            Sent::Failed { status, error, retryable, retry_after } => {
                let wait = (retryable && attempt < settings.max_attempts)
                    .then(|| backoff(settings, attempt, retry_after, rand::rng().random_range(0.5..=1.0)));
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
    for attempt in 0..4u32 {
        match store.record_callback_attempt(job, outcome, body).await {
            Ok(true) => return true,
            Ok(false) => {
                tracing::warn!(run_id = %job.run.id, "a callback's lease ran out before its attempt was recorded");
                return false;
            }
            Err(e) => {
                tracing::warn!(run_id = %job.run.id, error = %e, attempt, "recording a callback attempt failed");
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
        }
    }
    false
}

/// Wait before the attempt after `attempt`: exponential from `base_delay`,
/// capped at `max_delay`, scaled by `jitter` (0.5 to 1, so receivers that
/// failed together are not hit together again), and never shorter than what
/// the receiver asked for in `Retry-After` (up to [`MAX_RETRY_AFTER`]).
fn backoff(settings: &CallbackSettings, attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let exp = settings.base_delay.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let delay = exp.min(settings.max_delay).mul_f64(jitter.clamp(0.0, 1.0));
    match retry_after {
        Some(asked) => delay.max(asked.min(MAX_RETRY_AFTER)),
        None => delay,
    }
}

/// Extends `job`'s lease every third of its length; returns once the lease
/// is lost: taken over, or about to run out because the database has not
/// answered (given up a third early, so this worker stops before another
/// can start).
async fn keep_lease(settings: &CallbackSettings, store: &Store, job: &CallbackJob) {
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(settings.lease / 3).await;
        match store.extend_callback(job, settings.lease).await {
            Ok(true) => last_ok = Instant::now(),
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(run_id = %job.run.id, error = %e, "extending a callback's lease failed");
                if last_ok.elapsed() >= settings.lease / 3 * 2 {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callbacks::CallbackSecret;

    fn settings() -> CallbackSettings {
        CallbackSettings::new(CallbackSecret::new(b"k").unwrap())
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
