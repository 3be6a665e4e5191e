//! Reading a tunnel's TLS ClientHello without terminating TLS: the bytes
//! are parsed by rustls's `Acceptor` (which stops after the ClientHello)
//! and kept, to be sent on unchanged once the server name is checked.

use std::time::Duration;

use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncReadExt};

/// A ClientHello larger than this is refused (real ones are a few hundred
/// bytes to a few KiB, post-quantum key shares included).
pub const MAX_HELLO_BYTES: usize = 16 * 1024;
/// How long the client has to send it.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelloError {
    #[error("no TLS ClientHello (not TLS, or malformed)")]
    NotTls,
    #[error("the ClientHello is larger than {MAX_HELLO_BYTES} bytes")]
    TooLarge,
    #[error("the client closed before its ClientHello")]
    Closed,
    #[error("no ClientHello within {}s", HELLO_TIMEOUT.as_secs())]
    Timeout,
}

/// The first TLS flight: the server name it asks for (`None`: no SNI) and
/// every byte read, to forward.
#[derive(Debug)]
pub struct Hello {
    pub server_name: Option<String>,
    pub bytes: Vec<u8>,
}

/// Reads the ClientHello from `io`, with a deadline and a size bound.
pub async fn read<R: AsyncRead + Unpin>(io: &mut R) -> Result<Hello, HelloError> {
    tokio::time::timeout(HELLO_TIMEOUT, read_inner(io)).await.map_err(|_| HelloError::Timeout)?
}

async fn read_inner<R: AsyncRead + Unpin>(io: &mut R) -> Result<Hello, HelloError> {
    let mut acceptor = Acceptor::default();
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = io.read(&mut chunk).await.map_err(|_| HelloError::Closed)?;
        if n == 0 {
            return Err(HelloError::Closed);
        }
        if bytes.len() + n > MAX_HELLO_BYTES {
            return Err(HelloError::TooLarge);
        }
        bytes.extend_from_slice(&chunk[..n]);
        let mut fresh = &chunk[..n];
        while !fresh.is_empty() {
            acceptor.read_tls(&mut fresh).map_err(|_| HelloError::NotTls)?;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let server_name = accepted.client_hello().server_name().map(str::to_owned);
                return Ok(Hello { server_name, bytes });
            }
            Ok(None) => continue,
            Err(_) => return Err(HelloError::NotTls),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A real ClientHello, from rustls's client, for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[tokio::test]
    async fn reads_the_server_name_and_keeps_every_byte() {
        let hello = client_hello("allowed.test");
        let mut input = hello.clone();
        input.extend_from_slice(b"later bytes stay unread");
        // Arrives one byte at a time: the parser waits for the whole record.
        let (mut tx, mut rx) = tokio::io::duplex(1);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = tx.write_all(&input).await;
        });
        let got = read(&mut rx).await.unwrap();
        assert_eq!(got.server_name.as_deref(), Some("allowed.test"));
        assert_eq!(got.bytes, hello);
        writer.abort();
    }

    #[tokio::test]
    async fn an_ip_literal_has_no_server_name() {
        let got = read(&mut &client_hello("10.0.0.1")[..]).await.unwrap();
        assert_eq!(got.server_name, None);
    }

    #[tokio::test]
    async fn what_is_not_tls_is_refused() {
        assert_eq!(read(&mut &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..]).await.unwrap_err(), HelloError::NotTls);
        assert_eq!(read(&mut &b""[..]).await.unwrap_err(), HelloError::Closed);
        // A record header announcing more than the bound, then endless bytes.
        let mut huge = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        huge.resize(MAX_HELLO_BYTES + 10, 0x01);
        assert!(read(&mut &huge[..]).await.is_err());
    }
}
