//! An event stream's maximum life (`ApiSettings::sse_max_duration`),
//! enforced by one timer registration per stream.
//!
//! `StreamExt::take_until(sleep)` polls its timer before every poll of the
//! stream, registering the task's waker with the runtime's timer each time:
//! with a thousand streams following one run, that was one of the few
//! per-frame costs `kiln serve` had over a plain SSE server (profiled in
//! bench/README.md, fifth session). Here the timer is polled only when the
//! stream is about to wait and the task's waker is not the one the timer
//! already holds; a connection's task keeps its waker for its whole life,
//! so that is once per stream. A registered timer wakes the task at the
//! deadline whether or not it is polled again, and every poll reads the
//! clock first, so the stream still ends on time, idle or busy.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::Stream;
use tokio::time::{Instant, Sleep};

/// `S`, ended once its lifetime has passed.
pub(crate) struct Lifetime<S> {
    stream: Pin<Box<S>>,
    timer: Pin<Box<Sleep>>,
    /// The waker the timer holds, if it was polled.
    registered: Option<Waker>,
}

impl<S: Stream> Lifetime<S> {
    pub(crate) fn new(stream: S, lifetime: Duration) -> Self {
        Lifetime { stream: Box::pin(stream), timer: Box::pin(tokio::time::sleep(lifetime)), registered: None }
    }
}

impl<S: Stream> Stream for Lifetime<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        if Instant::now() >= this.timer.deadline() {
            return Poll::Ready(None);
        }
        match this.stream.as_mut().poll_next(cx) {
            Poll::Pending => {
                if !this.registered.as_ref().is_some_and(|held| held.will_wake(cx.waker())) {
                    if this.timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                    this.registered = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_ends_at_its_lifetime() {
        let started = Instant::now();
        let mut idle = Lifetime::new(futures::stream::pending::<u32>(), Duration::from_secs(30));
        assert_eq!(idle.next().await, None);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_stream_ends_at_its_lifetime_and_yields_until_then() {
        let ticks = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((n, n + 1))
        });
        let got: Vec<u32> = Lifetime::new(ticks, Duration::from_millis(5_500)).collect().await;
        assert_eq!(got, [0, 1, 2, 3, 4]);
    }

    /// The timer is registered again only for another waker: a second
    /// task polling the same stream is still woken at the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_new_waker_is_registered_with_the_timer() {
        let mut stream = Lifetime::new(futures::stream::pending::<u32>(), Duration::from_secs(10));
        let first = futures::task::noop_waker();
        assert!(stream.poll_next_unpin(&mut Context::from_waker(&first)).is_pending());
        assert!(stream.registered.as_ref().is_some_and(|w| w.will_wake(&first)));
        let started = Instant::now();
        let ended =
            tokio::time::timeout(Duration::from_secs(20), std::future::poll_fn(|cx| stream.poll_next_unpin(cx)))
                .await
                .expect("the second waker was never woken");
        assert_eq!((ended, started.elapsed()), (None, Duration::from_secs(10)));
    }
}
