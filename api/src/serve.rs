//! Serving the router over TCP with the connection limits `axum::serve`
//! does not set: a client must send a request's headers within
//! [`HttpTimeouts::header_read`] (hyper's timer is off without one, so a
//! client sending a byte a minute held its connection forever), and a
//! connection whose client takes no bytes for [`HttpTimeouts::write_stall`]
//! is closed (a reader that stopped would otherwise hold its socket and its
//! SSE slot for as long as it likes). How long a request may take to arrive
//! and be answered is the router's business (`ApiSettings::request_timeout`).

use std::io;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct HttpTimeouts {
    /// From a connection's open (or its previous response) to the end of
    /// the next request's headers. Also closes idle keep-alive connections.
    pub header_read: Duration,
    /// How long a write may wait for the client to take bytes.
    pub write_stall: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        // A minute's pause is something a client may do and come back from
        // on the same connection (the slow-client test pauses 60 s).
        HttpTimeouts { header_read: Duration::from_secs(30), write_stall: Duration::from_secs(120) }
    }
}

/// How long in-flight connections get to finish after `shutdown` fires
/// (SSE streams end on their own then; ordinary requests are short).
const DRAIN: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` fires, then stops accepting
/// and lets open connections finish (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: HttpTimeouts,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(timeouts.header_read);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was
                    // taken: nothing to do for it; don't spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        // Small writes (SSE events) go out at once.
        let _ = tcp.set_nodelay(true);
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(timeouts.write_stall));
        let service = TowerToHyperService::new(app.clone());
        let connection = builder.serve_connection(TokioIo::new(Box::pin(io)), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // Timeouts and clients that went away end up here.
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open {DRAIN:?} after shutdown; leaving them");
    }
    Ok(())
}
