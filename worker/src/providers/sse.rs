//! Server-sent events, shared by the providers: sending a streaming request,
//! splitting the body into events (WHATWG rules via `eventsource-stream`:
//! CR, LF and CRLF line ends, comment lines, multi-line data, optional space
//! after the colon, chunks split anywhere) and driving a provider's decoder
//! over those events.

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

/// Sends a request that should answer with an event stream and returns the
/// response once it is known to be one. `secret` is the API key in use, so
/// error messages can be scrubbed of it.
pub(crate) async fn open(
    request: reqwest::RequestBuilder,
    secret: Option<&str>,
) -> Result<reqwest::Response, ProviderError> {
    let response = request.header(reqwest::header::ACCEPT, "text/event-stream").send().await?;
    if !response.status().is_success() {
        return Err(ProviderError::from_response(response, secret).await);
    }
    let is_json = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if is_json {
        // Some proxies answer a streaming request with one JSON document,
        // often an error with status 200. Parsed as SSE it would look like an
        // empty, truncated stream and be retried forever.
        return Err(json_instead_of_stream(response).await);
    }
    Ok(response)
}

async fn json_instead_of_stream(response: reqwest::Response) -> ProviderError {
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(err) => return err.into(),
    };
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    match json {
        Some(json) if json.get("error").is_some_and(|e| !e.is_null()) => ProviderError::from_stream_error(&json),
        _ => ProviderError::Decode(
            "expected an event stream but got a JSON document; does this server support `stream: true`?".to_owned(),
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod test_support {
    //! Feeding recorded bytes through [`decode_stream`] the way a network
    //! would: in chunks of any size, with any line endings.

    use bytes::Bytes;
    use futures::TryStreamExt;

    use super::*;

    /// The fixtures shipped with the crate (copied from the project's shared
    /// fixture set so a clean clone can run them).
    pub(crate) fn fixture(path: &str) -> Vec<u8> {
        let full = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&full).unwrap_or_else(|e| panic!("reading {full}: {e}"))
    }

    pub(crate) fn fixture_names(dir: &str) -> Vec<String> {
        let full = format!("{}/tests/fixtures/{dir}", env!("CARGO_MANIFEST_DIR"));
        let mut names: Vec<String> = std::fs::read_dir(&full)
            .unwrap_or_else(|e| panic!("listing {full}: {e}"))
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sse"))
            .collect();
        names.sort();
        names
    }

    /// Splits `bytes` into chunks of `size` bytes, cutting through lines,
    /// JSON strings and multi-byte characters alike.
    pub(crate) fn chunked(bytes: &[u8], size: usize) -> Vec<Result<Bytes, std::io::Error>> {
        bytes.chunks(size.max(1)).map(|c| Ok(Bytes::copy_from_slice(c))).collect()
    }

    /// Chunk sizes that vary along the body (1, 2, 3, 5, 8, …), so every
    /// boundary lands somewhere different.
    pub(crate) fn chunked_varying(bytes: &[u8]) -> Vec<Result<Bytes, std::io::Error>> {
        let sizes = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89];
        let mut chunks = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < bytes.len() {
            let end = (at + sizes[i % sizes.len()]).min(bytes.len());
            chunks.push(Ok(Bytes::copy_from_slice(&bytes[at..end])));
            at = end;
            i += 1;
        }
        chunks
    }

    /// The same stream with CRLF line ends, as some proxies send it.
    pub(crate) fn to_crlf(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len() * 2);
        for &b in bytes {
            if b == b'\n' {
                out.push(b'\r');
            }
            out.push(b);
        }
        out
    }

    /// The same stream with bare CR line ends (legal SSE, rarely seen).
    pub(crate) fn to_cr(bytes: &[u8]) -> Vec<u8> {
        bytes.iter().map(|&b| if b == b'\n' { b'\r' } else { b }).collect()
    }

    /// All items of a decoded stream, errors included.
    pub(crate) async fn collect_items(stream: ModelStream) -> Vec<Result<ModelEvent, ProviderError>> {
        stream.collect().await
    }

    /// All events of a stream that must succeed.
    pub(crate) async fn collect_ok(stream: ModelStream) -> Vec<ModelEvent> {
        stream.try_collect().await.unwrap()
    }

    /// Recorded bytes, as chunks a network could deliver.
    pub(crate) type Chunks = futures::stream::Iter<std::vec::IntoIter<Result<Bytes, std::io::Error>>>;
    /// A provider's `decode_stream` for recorded chunks.
    pub(crate) type Decode = fn(Chunks) -> ModelStream;

    pub(crate) async fn decode_chunks(
        decode: Decode,
        chunks: Vec<Result<Bytes, std::io::Error>>,
    ) -> Vec<Result<ModelEvent, ProviderError>> {
        collect_items(decode(futures::stream::iter(chunks))).await
    }

    /// Decodes fixture `path` whole, in 1-, 7- and 64-byte chunks, in chunks
    /// of varying size and with CRLF and CR line ends; checks every variant
    /// yields the same items, and returns them.
    pub(crate) async fn decode_fixture_variants(decode: Decode, path: &str) -> Vec<Result<ModelEvent, ProviderError>> {
        let bytes = fixture(path);
        let whole = decode_chunks(decode, chunked(&bytes, bytes.len())).await;
        for size in [1, 7, 64] {
            assert_eq!(decode_chunks(decode, chunked(&bytes, size)).await, whole, "{path} in {size}-byte chunks");
        }
        assert_eq!(decode_chunks(decode, chunked_varying(&bytes)).await, whole, "{path} in varying chunks");
        assert_eq!(decode_chunks(decode, chunked_varying(&to_crlf(&bytes))).await, whole, "{path} with CRLF");
        assert_eq!(decode_chunks(decode, chunked(&to_cr(&bytes), 5)).await, whole, "{path} with CR");
        whole
    }

    /// Folds items that must all be events into the assistant message.
    pub(crate) fn assemble(items: &[Result<ModelEvent, ProviderError>]) -> crate::providers::assemble::Assembled {
        let mut builder = crate::providers::assemble::AssistantBuilder::new();
        for item in items {
            builder.push(item.as_ref().unwrap());
        }
        builder.finish()
    }

    /// A complete stream's items (exactly one Finish, last), assembled.
    pub(crate) fn assemble_complete(
        items: &[Result<ModelEvent, ProviderError>],
        name: &str,
    ) -> crate::providers::assemble::Assembled {
        assert_eq!(items.iter().filter(|i| matches!(i, Ok(ModelEvent::Finish(_)))).count(), 1, "{name}: one Finish");
        assert!(matches!(items.last(), Some(Ok(ModelEvent::Finish(_)))), "{name}: Finish comes last");
        assemble(items)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::test_support::*;
    use super::*;

    /// Echoes each SSE event as a text delta `event|data` so the framing
    /// itself can be checked.
    struct Echo;

    impl Decoder for Echo {
        fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError> {
            out.push(ModelEvent::TextDelta(format!("{}|{}", event.event, event.data)));
            Ok(Flow::Continue)
        }
        fn on_end(&mut self, _out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
            Ok(())
        }
    }

    async fn echo(body: &[u8], chunk: usize) -> Vec<String> {
        collect_ok(decode_stream(futures::stream::iter(chunked(body, chunk)), Echo))
            .await
            .into_iter()
            .map(|e| match e {
                ModelEvent::TextDelta(t) => t,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn whatwg_framing() {
        let body = ": comment\n\
            event: a\ndata: one\n\n\
            data:no-space\r\n\r\n\
            data: line1\rdata: line2\r\r\
            data:  two spaces\n\n\
            event: unterminated\ndata: lost\n";
        for chunk in [1, 3, 7, 64, 4096] {
            assert_eq!(
                echo(body.as_bytes(), chunk).await,
                vec!["a|one", "message|no-space", "message|line1\nline2", "message| two spaces"],
                "chunk size {chunk}"
            );
        }
    }

    #[tokio::test]
    async fn bare_cr_line_ends_up_to_the_last_event() {
        for chunk in [1, 2, 64] {
            assert_eq!(
                echo(b"data: a\r\rdata: b\r\r", chunk).await,
                vec!["message|a", "message|b"],
                "chunk size {chunk}"
            );
            // An event without its blank line is still incomplete at the end.
            assert_eq!(echo(b"data: a\r\rdata: b\r", chunk).await, vec!["message|a"], "chunk size {chunk}");
        }
    }

    #[tokio::test]
    async fn multibyte_characters_split_across_chunks() {
        let body = "data: 925 ÷ 5 = 185 — ok 👍\n\n";
        assert_eq!(echo(body.as_bytes(), 1).await, vec!["message|925 ÷ 5 = 185 — ok 👍"]);
    }

    #[tokio::test]
    async fn transport_error_ends_the_stream() {
        let items = vec![
            Ok(bytes::Bytes::from_static(b"data: a\n\n")),
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer")),
            Ok(bytes::Bytes::from_static(b"data: b\n\n")),
        ];
        let got = collect_items(decode_stream(futures::stream::iter(items), Echo)).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Ok(ModelEvent::TextDelta("message|a".into())));
        assert!(matches!(&got[1], Err(e @ ProviderError::Connection(_)) if e.is_retryable()), "{got:?}");
    }

    #[tokio::test]
    async fn invalid_utf8_is_a_decode_error_not_a_panic() {
        let items = vec![Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"data: \xff\xfe\n\n"))];
        let got = collect_items(decode_stream(futures::stream::iter(items), Echo)).await;
        assert!(got.iter().all(|item| !matches!(item, Ok(ModelEvent::TextDelta(t)) if t.contains('\u{fffd}'))));
        assert!(matches!(got.last(), Some(Err(ProviderError::Decode(_)))), "{got:?}");
    }
}
