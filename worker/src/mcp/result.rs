//! What an MCP tool's result becomes for the model: its text content, with
//! binary content described instead of dumped, cut to the same byte budget
//! as `view`'s output and said so when cut. The server's result is hostile
//! input like any other: its size is bounded twice, on the wire (the
//! transport refuses bodies over [`super::server::MAX_RESPONSE_BYTES`]) and
//! here.

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

use crate::tools::ToolOutcome;

/// Bytes of a result the model gets.
pub const MAX_OUTPUT_BYTES: usize = 100 * 1024;

/// The model-facing outcome of `result`.
pub fn outcome(result: CallToolResult) -> ToolOutcome {
    let mut parts: Vec<String> = result.content.into_iter().map(describe).collect();
    if parts.is_empty()
        && let Some(structured) = result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = cap(parts.join("\n"));
    if result.is_error == Some(true) { ToolOutcome::error(text) } else { ToolOutcome::ok(text) }
}

/// One content block as text.
fn describe(block: ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text,
        ContentBlock::Image(i) => {
            format!("[image ({}, {} bytes of base64) not shown]", clean(&i.mime_type), i.data.len())
        }
        ContentBlock::Audio(a) => {
            format!("[audio ({}, {} bytes of base64) not shown]", clean(&a.mime_type), a.data.len())
        }
        ContentBlock::Resource(r) => match r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource {}]\n{text}", clean(&uri)),
            ResourceContents::BlobResourceContents { uri, blob, .. } => {
                format!("[resource {} ({} bytes of base64) not shown]", clean(&uri), blob.len())
            }
            _ => "[resource of a kind Kiln does not show]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link {}]", clean(&link.uri)),
        // A kind of content newer than this client.
        _ => "[content of a kind Kiln does not show]".to_owned(),
    }
}

/// A label from the server, short and on one line.
fn clean(label: &str) -> String {
    label.chars().filter(|c| !c.is_control()).take(200).collect()
}

/// `text` cut to [`MAX_OUTPUT_BYTES`] at a character boundary, with a note
/// saying how much was left out.
pub fn cap(mut text: String) -> String {
    if text.len() <= MAX_OUTPUT_BYTES {
        return text;
    }
    let total = text.len();
    let mut end = MAX_OUTPUT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("\n[kiln] the MCP server's result was {total} bytes; only the first {end} are shown"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(value: serde_json::Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn text_is_joined_and_binary_described() {
        let r = result(json!({"content": [
            {"type": "text", "text": "a"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "b"}
        ]}));
        assert_eq!(outcome(r), ToolOutcome::ok("a\n[image (image/png, 4 bytes of base64) not shown]\nb"));
    }

    #[test]
    fn errors_and_structured_results_come_through() {
        let r = result(json!({"content": [{"type": "text", "text": "boom"}], "isError": true}));
        assert_eq!(outcome(r), ToolOutcome::error("boom"));
        let r = result(json!({"content": [], "structuredContent": {"sum": 3}}));
        assert_eq!(outcome(r), ToolOutcome::ok(r#"{"sum":3}"#));
    }

    #[test]
    fn huge_results_are_cut_at_a_character_boundary_and_say_so() {
        let big = "é".repeat(MAX_OUTPUT_BYTES);
        let out = cap(big);
        let (head, note) = out.split_once("\n[kiln]").unwrap();
        assert!(head.len() <= MAX_OUTPUT_BYTES && head.chars().all(|c| c == 'é'));
        assert!(note.contains(&format!("was {} bytes", 2 * MAX_OUTPUT_BYTES)), "{note}");
    }
}
