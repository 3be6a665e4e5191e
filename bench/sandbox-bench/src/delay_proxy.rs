//! A loopback TCP proxy that holds every chunk for a fixed time on its way
//! in either direction: a database across a network (in another zone, a
//! managed service), simulated on one machine. Figures taken through it
//! are a simulation and say so.
//!
//! Threads and `thread::sleep`, not tokio: tokio's timer counts in whole
//! milliseconds, coarser than the delays simulated (half a millisecond
//! each way is a round trip within a region).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Accepts on a loopback port of its own and relays each connection to
/// `target`, every chunk `one_way` late. Returns the port's address; the
/// proxy lives as long as the process.
pub fn start(target: SocketAddr, one_way: Duration) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    thread::spawn(move || {
        for client in listener.incoming() {
            let relayed = client.and_then(|client| relay(client, TcpStream::connect(target)?, one_way));
            if let Err(e) = relayed {
                eprintln!("delay proxy: a connection was not relayed: {e}");
            }
        }
    });
    Ok(addr)
}

fn relay(client: TcpStream, server: TcpStream, one_way: Duration) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    pipe(client.try_clone()?, server.try_clone()?, one_way);
    pipe(server, client, one_way);
    Ok(())
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (a
/// reader and a writer thread, so a delayed chunk does not hold back the
/// reading of the next).
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = from.read(&mut buf).unwrap_or(0);
            // An empty chunk is the end, passed on in its turn.
            if chunks.send((Instant::now() + delay, buf[..n].to_vec())).is_err() || n == 0 {
                return;
            }
        }
    });
    thread::spawn(move || {
        for (at, chunk) in due {
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if chunk.is_empty() {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            if to.write_all(&chunk).is_err() {
                return;
            }
        }
    });
}
