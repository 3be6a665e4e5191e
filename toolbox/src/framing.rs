//! Length-prefixed frames: a big-endian `u32` body length, then the body.
//!
//! Command output only ever travels JSON-escaped inside a body, so nothing a
//! command prints can be mistaken for framing. [`FrameDecoder`] is sans-I/O
//! (push bytes, pull frames) so an async client that receives arbitrary
//! chunks — the worker reading a Docker attach stream — can use it as is;
//! [`FrameReader`] wraps it for blocking readers.

use std::io::{self, Read, Write};

use serde::Serialize;

use crate::protocol::MAX_FRAME_BYTES;

const HEADER: usize = 4;
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug)]
pub enum FrameError {
    /// A frame announced more than the maximum. Its body is skipped (the
    /// stream stays aligned on the next frame) and never buffered.
    TooLarge {
        len: u64,
        max: usize,
    },
    /// The stream ended in the middle of a frame.
    Truncated,
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { len, max } => write!(f, "frame of {len} bytes exceeds the maximum of {max}"),
            FrameError::Truncated => write!(f, "stream ended in the middle of a frame"),
            FrameError::Io(e) => write!(f, "i/o error reading frames: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Splits a byte stream into frame bodies.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Bytes of an oversize frame still to be dropped as they arrive.
    skip: u64,
    max: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(MAX_FRAME_BYTES)
    }
}

impl FrameDecoder {
    pub fn new(max: usize) -> Self {
        FrameDecoder { buf: Vec::new(), skip: 0, max }
    }

    /// Appends received bytes.
    pub fn push(&mut self, mut data: &[u8]) {
        if self.skip > 0 {
            let n = usize::try_from(self.skip).unwrap_or(usize::MAX).min(data.len());
            self.skip -= n as u64;
            data = &data[n..];
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame body, if one has arrived.
    pub fn next_frame(&mut self) -> Option<Result<Vec<u8>, FrameError>> {
        if self.skip > 0 || self.buf.len() < HEADER {
            return None;
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max {
            // Drop the header and whatever part of the body is already here;
            // the rest is dropped by `push` as it comes.
            let here = (self.buf.len() - HEADER).min(len);
            self.buf.drain(..HEADER + here);
            self.skip = (len - here) as u64;
            return Some(Err(FrameError::TooLarge { len: len as u64, max: self.max }));
        }
        if self.buf.len() < HEADER + len {
            return None;
        }
        let body = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Some(Ok(body))
    }

    /// Whether the stream may end here: no partial frame is pending.
    pub fn is_at_boundary(&self) -> bool {
        self.buf.is_empty() && self.skip == 0
    }
}

/// Blocking frame reader over any `Read`.
pub struct FrameReader<R> {
    inner: R,
    decoder: FrameDecoder,
    chunk: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_max(inner, MAX_FRAME_BYTES)
    }

    pub fn with_max(inner: R, max: usize) -> Self {
        FrameReader { inner, decoder: FrameDecoder::new(max), chunk: vec![0; READ_CHUNK] }
    }

    /// The next frame body; `None` at a clean end of stream.
    pub fn read_frame(&mut self) -> Option<Result<Vec<u8>, FrameError>> {
        loop {
            if let Some(frame) = self.decoder.next_frame() {
                return Some(frame);
            }
            match self.inner.read(&mut self.chunk) {
                Ok(0) if self.decoder.is_at_boundary() => return None,
                Ok(0) => {
                    // Forget the partial frame so a further call reports a clean end.
                    self.decoder = FrameDecoder::new(self.decoder.max);
                    return Some(Err(FrameError::Truncated));
                }
                Ok(n) => self.decoder.push(&self.chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Some(Err(FrameError::Io(e))),
            }
        }
    }
}

/// Header and body of one frame, ready to write.
pub fn encode_frame(body: &[u8]) -> io::Result<Vec<u8>> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {} bytes exceeds the maximum of {MAX_FRAME_BYTES}", body.len()),
        ));
    }
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// Serializes `msg` as JSON and frames it.
pub fn encode_json<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    encode_frame(&body)
}

/// Writes one JSON frame (without flushing).
pub fn write_json<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    w.write_all(&encode_json(msg)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        encode_frame(body).unwrap()
    }

    /// Hands out its data a few bytes per `read`, like a slow pipe.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn frames_split_across_reads_are_reassembled() {
        let mut data = frame(b"{\"a\":1}");
        data.extend(frame(b""));
        data.extend(frame(&[b'x'; 1000]));
        for step in [1, 3, 7, 4096] {
            let mut r = FrameReader::new(Trickle { data: data.clone(), pos: 0, step });
            assert_eq!(r.read_frame().unwrap().unwrap(), b"{\"a\":1}");
            assert_eq!(r.read_frame().unwrap().unwrap(), b"");
            assert_eq!(r.read_frame().unwrap().unwrap(), vec![b'x'; 1000]);
            assert!(r.read_frame().is_none(), "clean end of stream");
        }
    }

    #[test]
    fn oversize_frame_is_skipped_without_buffering_and_the_stream_stays_aligned() {
        let mut d = FrameDecoder::new(16);
        let mut data = (1000u32).to_be_bytes().to_vec();
        data.extend(vec![b'z'; 1000]);
        data.extend(frame(b"next"));
        for chunk in data.chunks(100) {
            d.push(chunk);
            assert!(d.buf.len() <= 200, "the oversize body is never buffered");
            while let Some(f) = d.next_frame() {
                match f {
                    Err(FrameError::TooLarge { len, max }) => assert_eq!((len, max), (1000, 16)),
                    Ok(body) => assert_eq!(body, b"next"),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert!(d.is_at_boundary());
    }

    #[test]
    fn garbage_frame_body_is_returned_as_is_for_the_caller_to_reject() {
        // Framing knows nothing of JSON: a garbage body is a frame like any other.
        let mut data = frame(b"\xff\x00not json");
        data.extend(frame(b"{}"));
        let mut r = FrameReader::new(&data[..]);
        let garbage = r.read_frame().unwrap().unwrap();
        assert!(serde_json::from_slice::<serde_json::Value>(&garbage).is_err());
        assert_eq!(r.read_frame().unwrap().unwrap(), b"{}");
    }

    #[test]
    fn a_stream_cut_mid_frame_is_reported() {
        let data = frame(b"hello");
        let mut r = FrameReader::new(&data[..6]);
        assert!(matches!(r.read_frame(), Some(Err(FrameError::Truncated))));
        assert!(r.read_frame().is_none());
    }

    #[test]
    fn encoding_refuses_oversize_bodies() {
        assert!(encode_frame(&vec![0; MAX_FRAME_BYTES + 1]).is_err());
        assert_eq!(frame(b"ab"), vec![0, 0, 0, 2, b'a', b'b']);
    }
}
