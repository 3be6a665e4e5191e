//! A tunnel's bytes, moved by the kernel.
//!
//! Copied through user space (`copy_bidirectional`), every chunk of a
//! download is read into the proxy and written out again: two system calls
//! and two copies per 64 KiB, on whatever share of a core the proxy gets.
//! Under load that share is small while the direct path stays in the
//! kernel, and a 100 MB download through the proxy fell to 0.55× of direct
//! (bench/README, issue 33). Here each direction is `splice(2)`d from its
//! socket into a pipe and from the pipe into the other socket: the pages
//! move between the sockets without entering the proxy.
//!
//! Each direction ends on its sender's end of stream, which is passed on
//! as a shutdown of the receiver's sending side (a half-closed tunnel goes
//! on the other way, as TCP allows); the relay ends when both have, or at
//! the first error (dropping both sockets closes the tunnel). The cost is
//! a pipe per direction: four descriptors per open tunnel.

use std::io;

use rustix::net::Shutdown;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most bytes one `splice` takes from a socket: a pipe's default capacity,
/// so a pipe drained before the next is never full.
const CHUNK: usize = 64 * 1024;

/// Relays between `a` and `b` until both directions have ended.
pub(super) async fn both_ways(a: TcpStream, b: TcpStream) -> io::Result<()> {
    tokio::try_join!(one_way(&a, &b), one_way(&b, &a))?;
    Ok(())
}

/// Moves what `from` sends to `to` until `from` ends its stream.
async fn one_way(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let (pipe_out, pipe_in) = rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
    let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
    loop {
        let taken =
            when_ready(from, Interest::READABLE, || rustix::pipe::splice(from, None, &pipe_in, None, CHUNK, flags))
                .await?;
        if taken == 0 {
            // The receiver may be gone already; the other direction's own
            // end or error says so.
            let _ = rustix::net::shutdown(to, Shutdown::Write);
            return Ok(());
        }
        let mut left = taken;
        while left > 0 {
            let sent =
                when_ready(to, Interest::WRITABLE, || rustix::pipe::splice(&pipe_out, None, to, None, left, flags))
                    .await?;
            if sent == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left -= sent;
        }
    }
}

/// Runs `op` on `socket` once it is ready for `interest`, again each time
/// it would block (`try_io` then clears the readiness it waited for).
async fn when_ready(
    socket: &TcpStream,
    interest: Interest,
    mut op: impl FnMut() -> rustix::io::Result<usize>,
) -> io::Result<usize> {
    loop {
        socket.ready(interest).await?;
        match socket.try_io(interest, || op().map_err(io::Error::from)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Two connected loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialled = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (dialled, accepted)
    }

    /// Many megabytes each way at once arrive whole and in order; one side
    /// ending its stream leaves the other way open, and the relay ends when
    /// both have.
    #[tokio::test]
    async fn bytes_cross_both_ways_whole_and_a_half_closed_tunnel_goes_on() {
        let (mut client, proxy_side) = pair().await;
        let (upstream_side, mut server) = pair().await;
        let relay = tokio::spawn(both_ways(proxy_side, upstream_side));

        let download: Vec<u8> = (0..12_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let upload: Vec<u8> = download.iter().rev().copied().take(3_000_000).collect();
        let (mut client_in, mut client_out) = client.split();
        let (mut server_in, mut server_out) = server.split();
        let (got_upload, got_download, (), ()) = tokio::join!(
            async {
                let mut got = Vec::new();
                server_in.read_to_end(&mut got).await.unwrap();
                got
            },
            async {
                let mut got = Vec::new();
                client_in.read_to_end(&mut got).await.unwrap();
                got
            },
            async {
                // The client sends its upload and ends its stream first...
                client_out.write_all(&upload).await.unwrap();
                client_out.shutdown().await.unwrap();
            },
            async {
                // ...while the server's download keeps coming after it.
                server_out.write_all(&download[..download.len() / 2]).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                server_out.write_all(&download[download.len() / 2..]).await.unwrap();
                server_out.shutdown().await.unwrap();
            },
        );
        assert!(got_upload == upload, "upload: {} bytes of {}", got_upload.len(), upload.len());
        assert!(got_download == download, "download: {} bytes of {}", got_download.len(), download.len());
        relay.await.unwrap().unwrap();
    }

    /// A side that resets its connection ends the relay with an error
    /// rather than leaving it waiting.
    #[tokio::test]
    async fn a_reset_ends_the_relay() {
        let (client, proxy_side) = pair().await;
        let (upstream_side, _server) = pair().await;
        let relay = tokio::spawn(both_ways(proxy_side, upstream_side));
        client.set_zero_linger().unwrap();
        drop(client);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), relay).await;
        assert!(ended.is_ok(), "the relay outlived a reset connection");
    }
}
