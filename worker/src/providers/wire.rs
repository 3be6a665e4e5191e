//! What the wire formats' decoders share: reading event data into typed
//! structs leniently, the pieces of text and tool-call arguments they pass
//! on, and OpenAI-style usage.
//!
//! Lenient because compatible servers differ: a field of a shape a decoder
//! does not expect (a number where text was due, an object where a list
//! was) reads as absent, as a chunk without that field would, instead of
//! failing an answer that is otherwise fine. Only data that is not JSON at
//! all is an error.

use kiln_protocol::Usage;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, IgnoredAny};
use serde_json::{Map, Value};

use super::{ModelEvent, ProviderError};

/// Parses one event's data. JSON of another shape than `T` (`null`, a
/// list, an object with a key twice, which derived structs refuse) reads as
/// `T::default()`, an event with nothing in it.
pub(crate) fn parse<T: DeserializeOwned + Default>(data: &str, what: &str) -> Result<T, ProviderError> {
    // A list would read as a struct's fields in order (serde allows it); it
    // is not an event.
    let typed = if data.trim_start().starts_with('[') { None } else { serde_json::from_str(data).ok() };
    match typed {
        Some(event) => Ok(event),
        None => match serde_json::from_str::<IgnoredAny>(data) {
            Ok(_) => Ok(T::default()),
            Err(err) => Err(ProviderError::decode(&format!("{what} is not JSON ({err})"), data)),
        },
    }
}

/// An error event: the error object is read from the whole event, as the
/// provider shaped it.
pub(crate) fn stream_error(data: &str) -> ProviderError {
    let json: Value = serde_json::from_str(data).unwrap_or_default();
    ProviderError::from_stream_error(&json)
}

/// For `#[serde(default, deserialize_with = "lenient")]` on an `Option`
/// field: a value that is not a `T` reads as `None`. Never a list: no such
/// field holds one, and a list would read as a struct's fields in order.
pub(crate) fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Ok(match Value::deserialize(deserializer)? {
        Value::Array(_) => None,
        value => T::deserialize(value).ok(),
    })
}

/// For `#[serde(default, deserialize_with = "lenient_list")]` on a `Vec`
/// field: anything but a list reads as empty, and an element that is not a
/// `T` as `T::default()` (so the others keep their positions).
pub(crate) fn lenient_list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    Ok(match Value::deserialize(deserializer)? {
        Value::Array(items) => items.into_iter().map(|item| lenient(item).ok().flatten().unwrap_or_default()).collect(),
        _ => Vec::new(),
    })
}

/// `text` when it is there and not empty.
pub(crate) fn non_empty(text: &Option<String>) -> Option<&str> {
    text.as_deref().filter(|s| !s.is_empty())
}

/// Pushes `make(text)` when `text` is there and not empty.
pub(crate) fn push_text(out: &mut Vec<ModelEvent>, text: &Option<String>, make: impl FnOnce(String) -> ModelEvent) {
    if let Some(text) = non_empty(text) {
        out.push(make(text.to_owned()));
    }
}

/// An id for a tool call whose server sent none: its result must name one.
pub(crate) fn made_up_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// A function call's arguments: the JSON text the APIs specify, or the
/// object itself, as some servers send them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Arguments {
    Text(String),
    Object(Map<String, Value>),
}

impl Arguments {
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Arguments::Text(text) => text.is_empty(),
            Arguments::Object(object) => object.is_empty(),
        }
    }

    pub(crate) fn into_text(self) -> String {
        match self {
            Arguments::Text(text) => text,
            Arguments::Object(object) => Value::Object(object).to_string(),
        }
    }
}

/// Cached input tokens, in OpenAI's usage reports.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct CachedTokens {
    #[serde(default, deserialize_with = "lenient")]
    pub cached_tokens: Option<u64>,
}

/// OpenAI's APIs count cached input tokens inside the input; Kiln's
/// `input_tokens` (like Anthropic's) excludes them, so costs priced per
/// kind of token add up the same for every provider.
pub(crate) fn usage_with_cached_input(input: Option<u64>, output: Option<u64>, cached: Option<&CachedTokens>) -> Usage {
    let cached = cached.and_then(|c| c.cached_tokens).unwrap_or(0);
    Usage {
        input_tokens: input.unwrap_or(0).saturating_sub(cached),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "wire_tests.rs"]
mod tests;
