//! Riding out a database restart: a write the loop cannot do without is
//! retried while the database is unreachable, for a bounded time, instead of
//! failing the run at the first refused connection.

use std::future::Future;
use std::time::Duration;

use kiln_store::StoreError;

/// How long a write keeps trying. Shorter than a lease would be pointless:
/// past the lease another worker may take the run over anyway.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub async fn with_retry<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        match op().await {
            Err(e) if e.is_unavailable() && started.elapsed() < PATIENCE => {
                tracing::warn!(error = %e, ?delay, "database unavailable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn unavailable_is_retried_and_other_errors_are_not() {
        let calls = AtomicU32::new(0);
        let ok = with_retry(|| async {
            if calls.fetch_add(1, Ordering::SeqCst) < 3 { Err(StoreError::Unavailable("down".into())) } else { Ok(7) }
        })
        .await;
        assert_eq!(ok.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 4);

        let calls = AtomicU32::new(0);
        let err = with_retry(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(StoreError::Corrupt("bad".into()))
        })
        .await;
        assert!(err.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn patience_runs_out() {
        let err = with_retry(|| async { Err::<(), _>(StoreError::Unavailable("down".into())) }).await;
        assert!(matches!(err, Err(StoreError::Unavailable(_))));
    }
}
