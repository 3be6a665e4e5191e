//! Feeding recorded bytes through [`super::sse::decode_stream`] the way a network
//! would: in chunks of any size, with any line endings.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::{ModelEvent, ModelStream, ProviderError};

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
