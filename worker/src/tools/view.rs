use kiln_toolbox::protocol::{Reply, RequestBody, ViewRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, file_outcome, parse_arguments};
use super::{schema_of, unexpected};

const DEFAULT_LIMIT: usize = 2000;
const MAX_LINE_CHARS: usize = 2000;
/// Byte budget of one answer, whatever the line count.
const MAX_OUTPUT_BYTES: usize = 100 * 1024;
/// Without a toolbox, files are read whole through the archive API.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewArgs {
    /// File path, relative to /workspace or absolute.
    #[serde(alias = "file_path")]
    pub path: String,
    /// First line to show, 1-based (default 1).
    #[serde(default)]
    pub offset: Option<usize>,
    /// Number of lines to show (default 2000).
    #[serde(default)]
    pub limit: Option<usize>,
}

pub struct View;

#[async_trait::async_trait]
impl Tool for View {
    fn name(&self) -> &'static str {
        "view"
    }
    fn description(&self) -> &'static str {
        "Show a file's lines, numbered, with the total line count. Use offset and limit to page through \
         files of any size. Binary files are described, not shown. A file must be viewed before edit or write \
         may change it."
    }
    fn schema(&self) -> Value {
        schema_of::<ViewArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: ViewArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        let offset = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, DEFAULT_LIMIT);
        let request = ViewRequest {
            offset: offset as u64,
            limit: limit as u64,
            max_line_chars: MAX_LINE_CHARS as u64,
            max_bytes: MAX_OUTPUT_BYTES as u64,
            ..ViewRequest::new(args.path.clone())
        };
        match ask_toolbox(ctx, RequestBody::View(request), false).await? {
            Answer::Reply(Reply::View(v)) => {
                // What edit/write will insist the file still is.
                ctx.sandbox.record_seen(&args.path, v.version);
                return Ok(ToolOutcome::ok(v.text));
            }
            Answer::Reply(other) => return Err(unexpected(self.name(), &other)),
            Answer::Outcome(o) => return Ok(o),
            Answer::NoToolbox => {}
        }
        let bytes = match ctx.sandbox.read_file(&args.path, MAX_FILE_BYTES).await {
            Ok(b) => b,
            Err(e) => return file_outcome(e),
        };
        Ok(ToolOutcome::ok(render(&args.path, &bytes, offset, limit)))
    }
}

/// Numbered lines `offset..offset+limit` of `bytes`, with a header and a hint
/// on how to continue.
fn render(path: &str, bytes: &[u8], offset: usize, limit: usize) -> String {
    let probe = &bytes[..bytes.len().min(8192)];
    if probe.contains(&0) {
        return format!("{path}: binary file, {} bytes; not shown", bytes.len());
    }
    let text = String::from_utf8_lossy(bytes);
    let lossy_note = if matches!(text, std::borrow::Cow::Owned(_)) { " (invalid UTF-8 shown as \u{FFFD})" } else { "" };
    let total = text.lines().count();
    let mut out = format!("{path}: {total} lines, {} bytes{lossy_note}\n", bytes.len());
    if offset > total.max(1) {
        out.push_str(&format!("offset {offset} is past the end of the file"));
        return out;
    }
    let mut last = offset.saturating_sub(1);
    for (i, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        if out.len() > MAX_OUTPUT_BYTES {
            break;
        }
        let shown: String = line.chars().take(MAX_LINE_CHARS).collect();
        let cut = if shown.len() < line.len() { " [line truncated]" } else { "" };
        out.push_str(&format!("{:>6}\t{shown}{cut}\n", i + 1));
        last = i + 1;
    }
    if last < total {
        out.push_str(&format!(
            "[showing lines {offset}-{last} of {total}; to read more, call view with offset={}]",
            last + 1
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn lines_are_numbered_with_a_header() {
        let out = render("a.txt", b"one\ntwo\n", 1, 2000);
        assert_eq!(out, "a.txt: 2 lines, 8 bytes\n     1\tone\n     2\ttwo\n");
    }

    #[test]
    fn paging_says_how_to_continue() {
        let text: String = (1..=10).map(|i| format!("l{i}\n")).collect();
        let out = render("f", text.as_bytes(), 3, 4);
        assert!(out.contains("     3\tl3\n"));
        assert!(out.contains("     6\tl6\n"));
        assert!(!out.contains("l7"));
        assert!(out.ends_with("call view with offset=7]"));
    }

    #[test]
    fn binary_and_invalid_utf8_are_handled() {
        assert!(render("b", b"\x00\x01\x02", 1, 10).contains("binary file"));
        assert!(render("u", b"caf\xe9\n", 1, 10).contains("invalid UTF-8"));
    }

    #[test]
    fn long_lines_are_cut_with_a_marker() {
        let line = "x".repeat(5000);
        let out = render("l", line.as_bytes(), 1, 10);
        assert!(out.contains("[line truncated]"));
        assert!(out.len() < 2200);
    }
}
