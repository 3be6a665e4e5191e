//! Carrying a running command's output from the tools to `tool.output`
//! events while the calls of one batch run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use kiln_protocol::EventBody;
use kiln_store::StoreError;

use crate::event_sink::EventSink;
use crate::sandbox::OutputSink;

/// Chunks of one event at most: merging keeps the event count down when a
/// command prints fast, this keeps one event small.
const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Bytes waiting between the toolbox reader and the event writer, across
/// the batch's calls. The reader never waits (it serves every call of the
/// toolbox), so when the writer falls behind, chunks beyond this are
/// dropped (and the call's result says its output was cut) rather than
/// queued without bound.
pub const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;
/// Chunks waiting, whatever their size.
const MAX_QUEUED_CHUNKS: usize = 1024;

/// Where [`OutputStream::forward`] hands merged chunks: the run's event sink
/// (as `tool.output` events), or a test's vector.
#[async_trait::async_trait]
pub trait EmitOutput: Send {
    type Error;
    async fn emit_output(&mut self, call_id: String, text: String) -> Result<(), Self::Error>;
}

#[async_trait::async_trait]
impl EmitOutput for EventSink {
    type Error = StoreError;
    async fn emit_output(&mut self, call_id: String, text: String) -> Result<(), StoreError> {
        self.write_now(EventBody::ToolOutput { call_id, text }).await
    }
}

/// Collects the output chunks of a batch's calls, tagged with their call id.
pub struct OutputStream {
    tx: mpsc::Sender<(String, String)>,
    rx: mpsc::Receiver<(String, String)>,
    /// Bytes of text in the queue.
    queued: Arc<AtomicUsize>,
}

impl Default for OutputStream {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(MAX_QUEUED_CHUNKS);
        OutputStream { tx, rx, queued: Arc::default() }
    }
}

impl OutputStream {
    /// The sink a call's [`ToolContext`](super::ToolContext) gets.
    pub fn sink(&self, call_id: &str) -> OutputSink {
        let tx = self.tx.clone();
        let queued = self.queued.clone();
        let call_id = call_id.to_owned();
        Arc::new(move |text: String| {
            let len = text.len();
            // Reserve first, so concurrent senders cannot overshoot together.
            if queued.fetch_add(len, Ordering::AcqRel) + len > MAX_QUEUED_BYTES {
                queued.fetch_sub(len, Ordering::AcqRel);
                return false;
            }
            match tx.try_send((call_id.clone(), text)) {
                Ok(()) => true,
                Err(_) => {
                    queued.fetch_sub(len, Ordering::AcqRel);
                    false
                }
            }
        })
    }

    /// Drives `work` to completion, handing the chunks that arrive meanwhile
    /// to `emit` (consecutive chunks of one call merged), then the rest.
    pub async fn forward<T, S: EmitOutput>(self, work: impl Future<Output = T>, sink: &mut S) -> Result<T, S::Error> {
        let OutputStream { tx, mut rx, queued } = self;
        drop(tx);
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => {
                    for (call_id, text) in drain_merged(&mut rx, &queued, None) {
                        sink.emit_output(call_id, text).await?;
                    }
                    return Ok(out);
                }
                Some(first) = rx.recv() => {
                    for (call_id, text) in drain_merged(&mut rx, &queued, Some(first)) {
                        sink.emit_output(call_id, text).await?;
                    }
                }
            }
        }
    }
}

/// `first` and every chunk already queued, consecutive chunks of one call
/// merged (up to [`MAX_EVENT_BYTES`]), in arrival order. Never waits.
fn drain_merged(
    rx: &mut mpsc::Receiver<(String, String)>,
    queued: &AtomicUsize,
    first: Option<(String, String)>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut next = first.or_else(|| rx.try_recv().ok());
    while let Some((call_id, text)) = next {
        queued.fetch_sub(text.len(), Ordering::AcqRel);
        match out.last_mut() {
            Some((id, merged)) if *id == call_id && merged.len() < MAX_EVENT_BYTES => merged.push_str(&text),
            _ => out.push((call_id, text)),
        }
        next = rx.try_recv().ok();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Seen(Vec<(String, String)>);

    #[async_trait::async_trait]
    impl EmitOutput for Seen {
        type Error = ();
        async fn emit_output(&mut self, call_id: String, text: String) -> Result<(), ()> {
            self.0.push((call_id, text));
            Ok(())
        }
    }

    #[tokio::test]
    async fn chunks_are_merged_per_call_in_order_and_none_is_lost() {
        let stream = OutputStream::default();
        let (a, b) = (stream.sink("a"), stream.sink("b"));
        let work = async move {
            assert!(a("1".into()));
            a("2".into());
            b("3".into());
            a("4".into());
            7
        };
        let mut seen = Seen(Vec::new());
        let out = stream.forward(work, &mut seen).await;
        assert_eq!(out, Ok(7));
        let seen = seen.0;
        let joined: Vec<(&str, &str)> = seen.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(joined, [("a", "12"), ("b", "3"), ("a", "4")]);
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    struct Slow(usize);

    #[async_trait::async_trait]
    impl EmitOutput for Slow {
        type Error = ();
        async fn emit_output(&mut self, _call_id: String, text: String) -> Result<(), ()> {
            self.0 += text.len();
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_flood_the_writer_cannot_keep_up_with_is_dropped_not_queued() {
        let stream = OutputStream::default();
        let sink = stream.sink("a");
        // 100 MiB offered while nothing drains: the queue takes its bound
        // and refuses the rest, so the reader can say output was cut.
        let chunk = "x".repeat(64 * 1024);
        let accepted = (0..1600).filter(|_| sink(chunk.clone())).count();
        assert_eq!(accepted * chunk.len(), MAX_QUEUED_BYTES, "accepted up to the bound");
        assert!(stream.queued.load(Ordering::Acquire) <= MAX_QUEUED_BYTES);
        // Many tiny chunks are bounded by count too.
        let tiny = OutputStream::default();
        let tiny_sink = tiny.sink("b");
        let accepted = (0..100_000).filter(|_| tiny_sink("y".into())).count();
        assert_eq!(accepted, MAX_QUEUED_CHUNKS);
        // What was accepted is all delivered.
        let mut seen = Slow(0);
        stream.forward(async {}, &mut seen).await.unwrap();
        assert_eq!(seen.0, MAX_QUEUED_BYTES);
    }
}
