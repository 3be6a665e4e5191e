//! Serving the router over TCP with the connection limits `axum::serve`
//! does not set: a client must send a request's headers within
//! [`HttpTimeouts::header_read`] (hyper's timer is off without one, so a
//! client sending a byte a minute held its connection forever), and a
//! connection whose client takes no bytes for [`HttpTimeouts::write_stall`]
//! is closed (a reader that stopped would otherwise hold its socket and its
//! SSE slot for as long as it likes). How long a request may take to arrive
//! and be answered is the router's business (`ApiSettings::request_timeout`).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;

use crate::http2_idle::{Activity, Counted, IdleLimited};

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct HttpTimeouts {
    /// From a connection's open (or its previous response) to the end of
    /// the next request's headers. Also closes idle keep-alive connections,
    /// and HTTP/2 connections with no request in flight that have received
    /// nothing for as long.
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
    let protocols = Protocols::new(timeouts);
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
        tokio::spawn(protocols.clone().serve(tcp, app.clone(), graceful.watcher(), shutdown.clone()));
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open {DRAIN:?} after shutdown; leaving them");
    }
    Ok(())
}

/// What a client speaks, told by its first bytes.
#[derive(Debug, PartialEq)]
enum Protocol {
    Http1,
    /// HTTP/2 with prior knowledge (h2c): the connection preface.
    Http2,
    /// Closed, or silent past the header-read timeout, before saying.
    Neither,
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The two protocols' connection settings, shared by every connection.
///
/// HTTP/1 and HTTP/2 are served by hyper's own connections, chosen by
/// peeking at the client's first bytes, rather than by `hyper_util`'s auto
/// builder: its connection holds room for both protocols for the whole of
/// an HTTP/1 connection's life, and hands hyper the request in two reads,
/// which grows the connection's read buffer from 8 to 16 KiB. An idle
/// event stream is an HTTP/1 connection held open, so what it keeps is
/// what a thousand of them cost.
#[derive(Clone)]
struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    timeouts: HttpTimeouts,
}

impl Protocols {
    fn new(timeouts: HttpTimeouts) -> Self {
        let mut http1 = http1::Builder::new();
        http1.timer(TokioTimer::new()).header_read_timeout(timeouts.header_read);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new());
        Protocols { http1, http2, timeouts }
    }

    /// Serves one connection until it ends (or the graceful shutdown it is
    /// watched by has it end).
    async fn serve(self, tcp: TcpStream, app: Router, graceful: Watcher, shutdown: CancellationToken) {
        let sniffed = tokio::select! {
            sniffed = tokio::time::timeout(self.timeouts.header_read, sniff(&tcp)) => sniffed,
            // Nothing asked yet, so nothing to finish: a connection opened
            // ahead of use (a browser's or a balancer's) would otherwise
            // hold the shutdown for the whole header timeout.
            _ = shutdown.cancelled() => return,
        };
        let protocol = match sniffed {
            Ok(Ok(protocol)) => protocol,
            // Gone, or silent for as long as a request's headers may take.
            Ok(Err(_)) | Err(_) => Protocol::Neither,
        };
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(self.timeouts.write_stall));
        let service = TowerToHyperService::new(app);
        let ended = match protocol {
            Protocol::Http1 => graceful.watch(self.http1.serve_connection(TokioIo::new(Box::pin(io)), service)).await,
            // Boxed: the task of every connection is as large as its largest
            // state, and nearly all are HTTP/1.
            Protocol::Http2 => Box::pin(self.serve_http2(io, service, graceful)).await,
            Protocol::Neither => return,
        };
        if let Err(e) = ended {
            // Timeouts and clients that went away end up here.
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}

impl Protocols {
    /// An HTTP/2 connection, closed once idle for the header-read limit
    /// (hyper's HTTP/2 server has no idle limit of its own; see
    /// `http2_idle`).
    async fn serve_http2(
        &self,
        io: TimeoutStream<TcpStream>,
        service: TowerToHyperService<Router>,
        graceful: Watcher,
    ) -> Result<(), hyper::Error> {
        let activity = Arc::new(Activity::default());
        let io = TokioIo::new(IdleLimited::new(io, activity.clone(), self.timeouts.header_read));
        graceful.watch(self.http2.serve_connection(io, Counted::new(service, activity))).await
    }
}

/// Which protocol the client's first bytes are, without taking them: HTTP/2
/// if they are the preface, HTTP/1 from the first byte that differs from it.
async fn sniff(tcp: &TcpStream) -> io::Result<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    let mut pause = Duration::from_millis(5);
    loop {
        let n = tcp.peek(&mut first).await?;
        if n == 0 {
            return Ok(Protocol::Neither);
        }
        if first[..n] != H2_PREFACE[..n] {
            return Ok(Protocol::Http1);
        }
        if n == H2_PREFACE.len() {
            return Ok(Protocol::Http2);
        }
        // Part of the preface so far; `peek` would answer at once with the
        // same bytes, so wait for the rest rather than spin (longer each
        // time: a client that stops mid-preface is not woken for 200 times
        // a second until the timeout).
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}
