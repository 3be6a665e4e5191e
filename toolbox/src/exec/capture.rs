//! A command's output on its way out: sanitized as it arrives, kept (head and
//! tail) for the result, and streamed to the worker while the command runs.
//! Apart from the process handling (`supervise.rs`), which only decides
//! when to read the pipe and asks [`Collector::ready`] whether it may.

use crate::output::{HeadTail, Sanitizer};

/// Largest read from the output pipe, and so the largest streamed chunk.
pub(super) const CHUNK: usize = 16 * 1024;

/// Where streamed output goes. Offering never blocks, so a slow consumer
/// cannot stop us from enforcing the timeout; it only stops us reading the
/// pipe, which in turn blocks the command (backpressure, bounded memory).
pub trait OutputSink {
    /// Takes the chunk, or hands it back if the consumer is not ready.
    fn try_send(&self, chunk: String) -> Result<(), SinkError>;
    /// Blocks until the consumer takes the chunk (used once the command is over).
    fn send(&self, chunk: String) -> Result<(), SinkError>;
}

pub enum SinkError {
    Full(String),
    /// The consumer is gone: stop streaming, keep running.
    Closed,
}

/// Sanitizes output as it arrives, keeps head and tail, and streams it to the
/// sink in chunks no larger than [`CHUNK`] (plus escaping).
pub(super) struct Collector<'a> {
    sink: &'a dyn OutputSink,
    sanitizer: Sanitizer,
    capture: HeadTail,
    /// Text not yet taken by the sink.
    pending: String,
    streamed: u64,
    stream_cap: Option<u64>,
    streaming: bool,
}

impl<'a> Collector<'a> {
    pub(super) fn new(sink: &'a dyn OutputSink, cap: usize, stream_cap: Option<u64>) -> Self {
        Collector {
            sink,
            sanitizer: Sanitizer::new(),
            capture: HeadTail::new(cap),
            pending: String::new(),
            streamed: 0,
            stream_cap,
            streaming: true,
        }
    }

    /// What is kept for the result.
    pub(super) fn capture(&self) -> &HeadTail {
        &self.capture
    }

    /// Whether we may read more: only while the sink keeps up.
    pub(super) fn ready(&self) -> bool {
        self.pending.len() < CHUNK
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        let mut text = String::with_capacity(bytes.len());
        self.sanitizer.push(bytes, &mut text);
        self.take(&text);
    }

    fn take(&mut self, text: &str) {
        self.capture.push(text.as_bytes());
        if !self.streaming || text.is_empty() {
            return;
        }
        if let Some(cap) = self.stream_cap
            && self.streamed + text.len() as u64 > cap
        {
            self.streaming = false;
            self.pending.push_str(&format!(
                "\n[output streaming stopped after {} bytes; the result keeps the head and the tail]\n",
                self.streamed
            ));
            return;
        }
        self.streamed += text.len() as u64;
        self.pending.push_str(text);
    }

    /// Offers pending text to the sink without blocking.
    pub(super) fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        match self.sink.try_send(std::mem::take(&mut self.pending)) {
            Ok(()) => {}
            Err(SinkError::Full(back)) => self.pending = back,
            Err(SinkError::Closed) => self.streaming = false,
        }
    }

    /// Hands pending text to the sink, waiting for it (the command is over).
    pub(super) fn flush_blocking(&mut self) {
        if !self.pending.is_empty() && self.sink.send(std::mem::take(&mut self.pending)).is_err() {
            self.streaming = false;
        }
    }

    pub(super) fn finish(&mut self) {
        let mut tail = String::new();
        self.sanitizer.finish(&mut tail);
        self.take(&tail);
        self.flush_blocking();
    }
}
