//! Server-sent events, shared by the providers: splitting the body into
//! events (WHATWG rules via `eventsource-stream`: CR, LF and CRLF line ends,
//! comment lines, multi-line data, optional space after the colon, chunks
//! split anywhere) and driving a provider's decoder over those events.

use std::pin::pin;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::{ModelEvent, ModelStream, ProviderError};

pub(crate) use eventsource_stream::Event as SseEvent;

/// What a decoder wants after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// The provider's terminal event arrived; stop reading even if the
    /// connection stays open.
    Done,
}

/// One provider's wire format: SSE events in, [`ModelEvent`]s out.
pub(crate) trait Decoder: Send + 'static {
    /// Decodes one event, pushing zero or more model events. An `Err` ends
    /// the stream after the events already pushed.
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError>;

    /// The body ended before [`Flow::Done`]: push what completes the stream,
    /// or say why it is incomplete.
    fn on_end(&mut self, out: &mut Vec<ModelEvent>) -> Result<(), ProviderError>;
}

/// Runs `decoder` over a byte stream. This is the one path both live
/// responses and recorded fixtures take, so tests exercise what production
/// runs. After the first `Err` item the stream ends.
pub(crate) fn decode_stream<S, E, D>(bytes: S, mut decoder: D) -> ModelStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<ProviderError> + Send + 'static,
    D: Decoder,
{
    Box::pin(async_stream::stream! {
        let mut events = pin!(complete_final_cr(bytes).eventsource());
        let mut out = Vec::new();
        loop {
            let step = match events.next().await {
                Some(Ok(event)) => decoder.on_event(&event, &mut out),
                Some(Err(err)) => Err(sse_error(err)),
                None => decoder.on_end(&mut out).map(|()| Flow::Done),
            };
            for event in out.drain(..) {
                yield Ok(event);
            }
            match step {
                Ok(Flow::Continue) => {}
                Ok(Flow::Done) => break,
                Err(err) => {
                    yield Err(err);
                    break;
                }
            }
        }
    })
}

/// Passes the bytes through, adding a LF after a final CR. At the end of
/// the body a CR is a complete line end, but `eventsource-stream` waits for a
/// LF that might follow it, and would drop the last event of a stream that
/// uses bare CR line ends. The added LF turns that CR into a CRLF.
fn complete_final_cr<S, E>(bytes: S) -> impl Stream<Item = Result<Bytes, E>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: Send,
{
    async_stream::stream! {
        let mut bytes = pin!(bytes);
        let mut last_was_cr = false;
        while let Some(item) = bytes.next().await {
            if let Ok(chunk) = &item
                && let Some(&last) = chunk.last()
            {
                last_was_cr = last == b'\r';
            }
            yield item;
        }
        if last_was_cr {
            yield Ok(Bytes::from_static(b"\n"));
        }
    }
}

fn sse_error<E: Into<ProviderError>>(err: EventStreamError<E>) -> ProviderError {
    match err {
        EventStreamError::Transport(err) => err.into(),
        EventStreamError::Utf8(_) => ProviderError::Decode("the event stream is not valid UTF-8".to_owned()),
        EventStreamError::Parser(err) => ProviderError::Decode(format!("malformed event stream line: {:?}", err.code)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "sse_tests.rs"]
mod tests;
