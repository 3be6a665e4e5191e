//! A loopback TCP proxy whose network can be cut: what a browser (or any
//! client) sees when its connection drops and comes back.
//!
//! [`CutProxy::cut`] closes every connection open through the proxy and
//! turns new ones away until [`CutProxy::restore`]. Unlike Chromium's
//! network emulation, which leaves requests that are already streaming
//! alone, this really ends an open EventSource response.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct CutProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    cut: AtomicBool,
    /// Connections turned away while cut.
    refused: AtomicU64,
    /// Cancelled on a cut: every connection made before it closes.
    connections: Mutex<CancellationToken>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            cut: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            connections: Mutex::new(CancellationToken::new()),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if s.cut.load(Ordering::SeqCst) {
                    s.refused.fetch_add(1, Ordering::SeqCst);
                    drop(inbound); // cut: the connection closes at once, with nothing said
                    continue;
                }
                let closed = s.connections.lock().expect("proxy lock").clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = closed.cancelled() => {}
                    }
                });
            }
        });
        CutProxy { addr, shared, accept }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections were turned away while cut, so far.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        let old = std::mem::take(&mut *self.shared.connections.lock().expect("proxy lock"));
        old.cancel();
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(connections) = self.shared.connections.lock() {
            connections.cancel();
        }
    }
}
