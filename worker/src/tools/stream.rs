//! Carrying a running command's output from the tools to `tool.output`
//! events while the calls of one batch run.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use kiln_protocol::EventBody;
use kiln_store::StoreError;

use crate::agent::events::EventSink;
use crate::sandbox::OutputSink;

/// Chunks of one event at most: merging keeps the event count down when a
/// command prints fast, this keeps one event small.
const MAX_EVENT_BYTES: usize = 64 * 1024;

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
    tx: mpsc::UnboundedSender<(String, String)>,
    rx: mpsc::UnboundedReceiver<(String, String)>,
}

impl Default for OutputStream {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        OutputStream { tx, rx }
    }
}

impl OutputStream {
    /// The sink a call's [`ToolContext`](super::ToolContext) gets.
    pub fn sink(&self, call_id: &str) -> OutputSink {
        let tx = self.tx.clone();
        let call_id = call_id.to_owned();
        // The toolbox bounds what it streams per command, so the queue is too.
        Arc::new(move |text| {
            let _ = tx.send((call_id.clone(), text));
        })
    }

    /// Drives `work` to completion, handing the chunks that arrive meanwhile
    /// to `emit` (consecutive chunks of one call merged), then the rest.
    pub async fn forward<T, S: EmitOutput>(self, work: impl Future<Output = T>, sink: &mut S) -> Result<T, S::Error> {
        let mut rx = self.rx;
        drop(self.tx);
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => {
                    for (call_id, text) in drain_merged(&mut rx, None) {
                        sink.emit_output(call_id, text).await?;
                    }
                    return Ok(out);
                }
                Some(first) = rx.recv() => {
                    for (call_id, text) in drain_merged(&mut rx, Some(first)) {
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
    rx: &mut mpsc::UnboundedReceiver<(String, String)>,
    first: Option<(String, String)>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut next = first.or_else(|| rx.try_recv().ok());
    while let Some((call_id, text)) = next {
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
            a("1".into());
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
