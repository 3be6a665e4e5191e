//! A [`Reply`] made concrete for one request: ids assigned, token counts
//! estimated, text and arguments cut into the pieces a real model streams.

use crate::script::Reply;

/// One answer, ready to render in either wire format.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Sequence number of the request (1-based), for message ids.
    pub seq: usize,
    pub model: String,
    pub text: String,
    pub calls: Vec<PlannedCall>,
    pub hang: bool,
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cached_tokens: u64,
    /// Input tokens written to the prompt cache (Anthropic reports them).
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct PlannedCall {
    /// The number in `call_N` / `toolu_N`, unique across the server's life
    /// so ids never repeat within a conversation.
    pub number: u64,
    /// The id the script chose, instead of one made from `number`.
    pub id: Option<String>,
    pub name: String,
    /// The arguments as JSON text, as a model writes them.
    pub arguments: String,
}

impl PlannedCall {
    /// The call's id on the wire: the script's, or `prefix` and the number.
    pub fn id(&self, prefix: &str) -> String {
        self.id.clone().unwrap_or_else(|| format!("{prefix}{}", self.number))
    }
}

impl Plan {
    /// `first_call` is the number the first tool call gets.
    pub fn new(seq: usize, model: String, reply: &Reply, request_len: usize, first_call: u64) -> Plan {
        let text = reply.text.clone().unwrap_or_default();
        let calls: Vec<PlannedCall> = reply
            .tool_calls
            .iter()
            .zip(first_call..)
            .map(|(call, number)| PlannedCall {
                number,
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.to_string(),
            })
            .collect();
        // Rough but plausible: about four bytes per token.
        let output_len = text.len() + calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>();
        Plan {
            seq,
            model,
            text,
            calls,
            hang: reply.hang,
            input_tokens: reply.usage.map_or((request_len / 4) as u64, |(input, _)| input),
            cached_tokens: reply.cached_input,
            cache_write_tokens: 0,
            output_tokens: reply.usage.map_or((output_len / 4 + 1) as u64, |(_, output)| output),
        }
    }

    /// The text of a hanging answer's single delta.
    pub fn hang_text(&self) -> &str {
        if self.text.is_empty() { "Working" } else { &self.text }
    }
}

/// Text in pieces of a few characters, as a model streams tokens. Pieces
/// end on character boundaries: a JSON string cannot carry half a
/// character.
pub(crate) fn text_pieces(text: &str) -> Vec<&str> {
    split_at_lengths(text, &[4])
}

/// Argument JSON text cut at irregular byte positions (moved to the next
/// character boundary), so consumers see keys, escapes and values split
/// mid-way, as real models send them.
pub(crate) fn argument_pieces(json: &str) -> Vec<&str> {
    split_at_lengths(json, &[1, 6, 3, 11, 2, 8, 5])
}

/// Splits `text` into consecutive pieces whose byte lengths cycle through
/// `lengths`, each cut moved forward to a character boundary.
fn split_at_lengths<'a>(text: &'a str, lengths: &[usize]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for &len in lengths.iter().cycle() {
        if start >= text.len() {
            break;
        }
        let mut end = (start + len.max(1)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[start..end]);
        start = end;
    }
    pieces
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_on_char_boundaries() {
        for text in ["", "a", "Hello, world!", "925 ÷ 5 = 185 — 👍👍", "{\"command\":\"echo \\\"hi\\\"\"}"] {
            let pieces = text_pieces(text);
            assert_eq!(pieces.concat(), text);
            let pieces = argument_pieces(text);
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| !p.is_empty()));
        }
        assert_eq!(argument_pieces("{\"a\":\"bc\"}"), vec!["{", "\"a\":\"b", "c\"}"]);
        assert!(text_pieces("Hello, world!").len() > 2);
    }
}
