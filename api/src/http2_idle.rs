//! Closing an idle HTTP/2 connection.
//!
//! An HTTP/1 connection waits for its next request's headers under hyper's
//! header-read timeout, so an idle one is closed. hyper's HTTP/2 server has
//! no such limit: a client could open connections, say the preface and
//! hold them, costing a socket and a task each, for ever. Here a connection
//! is idle when none of its requests is in flight (from the request's
//! headers until its response body has been sent, or dropped) and it has
//! received no bytes for the limit; its read then fails with `TimedOut`,
//! which ends the connection. A request in flight, however quiet (an event
//! stream on a run with nothing to say), keeps it open.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use hyper::body::{Body, Frame, SizeHint};
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The requests in flight on one connection, and the task reading it.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    /// The connection's reader, woken when the last request ends so that
    /// it starts counting idle time.
    reader: AtomicWaker,
}

impl Activity {
    fn enter(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// One request in flight; counted until dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reader.wake();
        }
    }
}

/// The connection's stream: reads fail with `TimedOut` once it has been
/// idle for the limit.
pub(crate) struct IdleLimited<I> {
    inner: Pin<Box<I>>,
    activity: Arc<Activity>,
    limit: Duration,
    /// Armed while idle, from the moment it became so.
    idle: Option<Pin<Box<Sleep>>>,
}

impl<I> IdleLimited<I> {
    pub(crate) fn new(inner: I, activity: Arc<Activity>, limit: Duration) -> Self {
        IdleLimited { inner: Box::pin(inner), activity, limit, idle: None }
    }
}

impl<I: AsyncRead> AsyncRead for IdleLimited<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        if let Poll::Ready(read) = self.inner.as_mut().poll_read(cx, buf) {
            if buf.filled().len() > before {
                // Bytes came: idle time counts from the next wait.
                self.idle = None;
            }
            return Poll::Ready(read);
        }
        // Registered before the count is read: a request that ends after
        // the read wakes this task, which then arms the timer.
        self.activity.reader.register(cx.waker());
        if self.activity.in_flight.load(Ordering::Acquire) > 0 {
            self.idle = None;
            return Poll::Pending;
        }
        let limit = self.limit;
        let idle = self.idle.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "HTTP/2 connection idle"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncWrite> AsyncWrite for IdleLimited<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_shutdown(cx)
    }
}

/// The connection's service, counting each request in flight until its
/// response body is done.
#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Counted { inner, activity }
    }
}

type Answer<B, E> = Pin<Box<dyn Future<Output = Result<Response<CountedBody<B>>, E>> + Send>>;

impl<S, R, B> hyper::service::Service<Request<R>> for Counted<S>
where
    S: hyper::service::Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody<B>>;
    type Error = S::Error;
    type Future = Answer<B, S::Error>;

    fn call(&self, request: Request<R>) -> Self::Future {
        let in_flight = self.activity.enter();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| CountedBody { body: Box::pin(body), _in_flight: in_flight }))
        })
    }
}

/// A response body that keeps its request counted while it is sent.
pub(crate) struct CountedBody<B> {
    body: Pin<Box<B>>,
    _in_flight: InFlight,
}

impl<B: Body> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limited(activity: &Arc<Activity>) -> (IdleLimited<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64);
        (IdleLimited::new(ours, activity.clone(), Duration::from_millis(200)), theirs)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_nothing_in_flight_times_out_after_the_limit() {
        let activity = Arc::new(Activity::default());
        let (mut conn, mut client) = limited(&activity);
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        let started = tokio::time::Instant::now();
        let idle = conn.read(&mut buf).await;
        assert_eq!(idle.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_it_open_and_its_end_starts_the_clock() {
        let activity = Arc::new(Activity::default());
        let (mut conn, _client) = limited(&activity);
        let request = activity.enter();
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let read = conn.read(&mut buf).await;
            (read.map_err(|e| e.kind()), tokio::time::Instant::now())
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!reading.is_finished(), "closed with a request in flight");
        let ended = tokio::time::Instant::now();
        drop(request);
        let (read, at) = reading.await.unwrap();
        assert_eq!(read, Err(io::ErrorKind::TimedOut));
        assert_eq!(at - ended, Duration::from_millis(200));
    }
}
