use kiln_toolbox::protocol::{Reply, RequestBody, ViewRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, file_outcome, parse_arguments};
use super::{schema_of, unexpected};
use crate::sandbox::FilePage;

const DEFAULT_LIMIT: usize = 2000;
const MAX_LINE_CHARS: usize = 2000;
/// Byte budget of one answer, whatever the line count.
const MAX_OUTPUT_BYTES: usize = 100 * 1024;

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
        "Show a file's lines, numbered, with its size and line count. Use offset and limit to page through \
         files of any size: only the page asked for is read, so the first view of a very large file may say \
         \"at least N lines\" until the rest has been counted. Binary files are described, not shown. A file \
         must be viewed before edit or write may change it."
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
        // Without a toolbox: one exec that reads no further than the page.
        let last = (offset as u64).saturating_add(limit as u64 - 1);
        let keep = (MAX_LINE_CHARS * 4) as u64;
        match ctx.sandbox.read_page(&args.path, offset as u64, last, keep).await {
            Ok(page) => Ok(ToolOutcome::ok(render(&args.path, &page, offset))),
            Err(e) => file_outcome(e),
        }
    }
}

/// Numbered lines of a page read without the toolbox, with a header and a
/// hint on how to continue; the total only if the read reached the end.
fn render(path: &str, page: &FilePage, offset: usize) -> String {
    if page.binary {
        return format!("{path}: binary file, {} bytes; not shown", page.size);
    }
    let mut body = String::new();
    let mut lossy = false;
    let mut last = offset.saturating_sub(1);
    for (i, (len, raw)) in page.lines.iter().enumerate() {
        if body.len() > MAX_OUTPUT_BYTES {
            break;
        }
        let text = String::from_utf8_lossy(raw);
        lossy |= matches!(text, std::borrow::Cow::Owned(_));
        let shown: String = text.chars().take(MAX_LINE_CHARS).collect();
        let cut = if (shown.len() as u64) < *len { " [line truncated]" } else { "" };
        body.push_str(&format!("{:>6}\t{}{cut}\n", offset + i, shown.trim_end_matches('\r')));
        last = offset + i;
    }
    let lossy_note = if lossy { " (invalid UTF-8 shown as \u{FFFD})" } else { "" };
    let (total, of) = if page.exact {
        (format!("{} lines", page.total), page.total.to_string())
    } else {
        (format!("at least {} lines (not yet counted to the end)", page.total), format!("at least {}", page.total))
    };
    let mut out = if page.exact {
        format!("{path}: {total}, {} bytes{lossy_note}\n", page.size)
    } else {
        format!("{path}: {} bytes, {total}{lossy_note}\n", page.size)
    };
    if page.lines.is_empty() && offset > 1 {
        out.push_str(&format!("offset {offset} is past the end of the file"));
        return out;
    }
    out.push_str(&body);
    if (last as u64) < page.total {
        out.push_str(&format!(
            "[showing lines {offset}-{last} of {of}; to read more, call view with offset={}]",
            last + 1
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{FilePage, render};

    fn page(lines: &[&[u8]], total: u64, exact: bool) -> FilePage {
        let lines = lines.iter().map(|l| (l.len() as u64, l.to_vec())).collect();
        FilePage { size: 1000, binary: false, lines, total, exact }
    }

    #[test]
    fn lines_are_numbered_with_a_header() {
        let out = render("a.txt", &page(&[b"one", b"two"], 2, true), 1);
        assert_eq!(out, "a.txt: 2 lines, 1000 bytes\n     1\tone\n     2\ttwo\n");
    }

    #[test]
    fn paging_says_how_to_continue_and_claims_no_total_it_does_not_know() {
        let out = render("f", &page(&[b"l3", b"l4\r", b"l5", b"l6"], 7, false), 3);
        assert!(out.starts_with("f: 1000 bytes, at least 7 lines (not yet counted to the end)\n"), "{out}");
        assert!(out.contains("     3\tl3\n     4\tl4\n"));
        assert!(out.contains("     6\tl6\n"));
        assert!(out.ends_with("[showing lines 3-6 of at least 7; to read more, call view with offset=7]"), "{out}");
        let end = render("f", &page(&[b"l9", b"l10"], 10, true), 9);
        assert!(end.starts_with("f: 10 lines, 1000 bytes\n") && !end.contains("read more"), "{end}");
        assert!(render("f", &page(&[], 10, true), 12).contains("offset 12 is past the end"));
    }

    #[test]
    fn binary_and_invalid_utf8_are_handled() {
        let binary = FilePage { binary: true, ..page(&[], 0, false) };
        assert!(render("b", &binary, 1).contains("binary file"));
        assert!(render("u", &page(&[b"caf\xe9"], 1, true), 1).contains("invalid UTF-8"));
    }

    #[test]
    fn long_lines_are_cut_with_a_marker() {
        let line = "x".repeat(9000);
        let mut p = page(&[&line.as_bytes()[..8000]], 1, true);
        p.lines[0].0 = 9000;
        let out = render("l", &p, 1);
        assert!(out.contains("[line truncated]"));
        assert!(out.len() < 2200);
    }
}
