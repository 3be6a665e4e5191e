use super::*;
use crate::providers::test_support::*;

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
        assert_eq!(echo(b"data: a\r\rdata: b\r\r", chunk).await, vec!["message|a", "message|b"], "chunk size {chunk}");
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
