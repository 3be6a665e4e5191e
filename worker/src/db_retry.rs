//! Riding out a database restart: a write the loop cannot do without is
//! retried while the database is unreachable, for a bounded time, instead of
//! failing the run at the first refused connection.

use std::future::Future;

use kiln_store::StoreError;

use crate::retry::{self, Verdict};

/// Retries `op` under [`retry::DATABASE`] while the database is unreachable;
/// any other error is returned at once.
pub async fn with_retry<T, F, Fut>(op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    retry::retry(
        &retry::DATABASE,
        op,
        |e: &StoreError| Verdict::retry_if(e.is_unavailable()),
        |e, _, delay| tracing::warn!(error = %e, ?delay, "database unavailable; retrying"),
    )
    .await
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
