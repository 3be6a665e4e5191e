//! `edit`: replace exact text in a file, once (or everywhere), with a diff.
//!
//! A failed match is where models lose the most turns, so the error says as
//! much as it can: where a whitespace-insensitive match is, or which lines
//! look closest, with their numbers and exact text.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use similar::TextDiff;

use crate::files::{check_expected, io_error, regular_file, resolve, version_of, write_bytes};
use crate::protocol::{EditRequest, EditResult, ErrorKind, ToolError};

/// Files are edited in memory; beyond this, `bash` (sed, patch) is the tool.
const MAX_EDIT_BYTES: u64 = 64 * 1024 * 1024;
const MAX_DIFF_BYTES: usize = 8 * 1024;
/// How many occurrences a `not_unique` error lists.
const MAX_LISTED: usize = 10;
/// Candidate windows a `no_match` error shows.
const MAX_CANDIDATES: usize = 2;
/// Lines of the file scanned for near matches.
const MAX_SCANNED_LINES: usize = 200_000;

pub fn edit(base: &Path, req: &EditRequest) -> Result<EditResult, ToolError> {
    if req.old_string.is_empty() {
        return Err(ToolError::new(
            ErrorKind::InvalidArgument,
            "old_string must not be empty; use write to create a file",
        ));
    }
    if req.old_string == req.new_string {
        return Err(ToolError::new(ErrorKind::InvalidArgument, "old_string and new_string are the same"));
    }
    let path = resolve(base, &req.path)?;
    let meta = regular_file(&path)?;
    check_expected(&path, Some(version_of(&meta)), req.expected)?;
    if meta.len() > MAX_EDIT_BYTES {
        return Err(ToolError::new(
            ErrorKind::TooLarge,
            format!(
                "{} is {} bytes, over the edit limit of {MAX_EDIT_BYTES}; use bash (sed, patch)",
                path.display(),
                meta.len()
            ),
        ));
    }
    let bytes = std::fs::read(&path).map_err(|e| io_error(&path, &e))?;
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(ToolError::new(
            ErrorKind::NotText,
            format!("{} is not valid UTF-8 text; edit it with bash", path.display()),
        ));
    };
    let shown = path.to_string_lossy().into_owned();

    let (old, new) = match_line_endings(&text, &req.old_string, &req.new_string);
    let positions: Vec<usize> = text.match_indices(old.as_str()).map(|(i, _)| i).collect();
    match positions.len() {
        0 => return Err(ToolError::new(ErrorKind::NoMatch, no_match_message(&shown, &text, &req.old_string))),
        n if n > 1 && !req.replace_all => {
            let lines: Vec<String> =
                positions.iter().take(MAX_LISTED).map(|&p| line_of(&text, p).to_string()).collect();
            let more = if n > MAX_LISTED { ", …" } else { "" };
            return Err(ToolError::new(
                ErrorKind::NotUnique,
                format!(
                    "old_string occurs {n} times in {shown} (at lines {}{more}); include more surrounding lines to make it unique, or set replace_all",
                    lines.join(", ")
                ),
            ));
        }
        _ => {}
    }
    let updated = if req.replace_all { text.replace(old.as_str(), &new) } else { text.replacen(old.as_str(), &new, 1) };
    let version = write_bytes(&path, updated.as_bytes())?;
    Ok(EditResult {
        path: shown.clone(),
        replacements: positions.len() as u64,
        diff: diff(&shown, &text, &updated),
        version,
    })
}

/// Models copy text from `view`, which shows CRLF lines without the `\r`:
/// in a CRLF file, match and replace with CRLF line ends.
fn match_line_endings(text: &str, old: &str, new: &str) -> (String, String) {
    if old.contains('\n') && !old.contains("\r\n") && text.contains("\r\n") && !text.contains(old) {
        let crlf = old.replace('\n', "\r\n");
        if text.contains(&crlf) {
            return (crlf, new.replace("\r\n", "\n").replace('\n', "\r\n"));
        }
    }
    (old.to_string(), new.to_string())
}

/// 1-based line number of byte offset `pos`.
fn line_of(text: &str, pos: usize) -> usize {
    memchr::memchr_iter(b'\n', &text.as_bytes()[..pos]).count() + 1
}

fn no_match_message(path: &str, text: &str, old: &str) -> String {
    let mut msg = format!("old_string was not found in {path}.");
    let lines: Vec<&str> = text.lines().take(MAX_SCANNED_LINES).collect();
    let wanted: Vec<&str> = old.lines().collect();
    if let Some(at) = whitespace_insensitive_match(&lines, &wanted) {
        msg.push_str(" It matches if whitespace at the start and end of lines is ignored — copy the exact text (indentation) from the file:\n");
        show_window(&mut msg, &lines, at, wanted.len());
        return msg;
    }
    let candidates = closest_windows(&lines, &wanted);
    if candidates.is_empty() {
        msg.push_str(" No similar lines were found; view the file to check its current content.");
        return msg;
    }
    msg.push_str(" The closest lines in the file are:\n");
    for (i, at) in candidates.into_iter().enumerate() {
        if i > 0 {
            msg.push_str("--\n");
        }
        show_window(&mut msg, &lines, at, wanted.len());
    }
    msg
}

fn show_window(out: &mut String, lines: &[&str], at: usize, len: usize) {
    for (i, line) in lines.iter().enumerate().skip(at).take(len.clamp(1, 12)) {
        let _ = writeln!(out, "{:>6}\t{line}", i + 1);
    }
}

fn whitespace_insensitive_match(lines: &[&str], wanted: &[&str]) -> Option<usize> {
    if wanted.is_empty() || wanted.len() > lines.len() {
        return None;
    }
    (0..=lines.len() - wanted.len())
        .find(|&i| lines[i..i + wanted.len()].iter().zip(wanted).all(|(a, b)| a.trim() == b.trim()))
}

/// Start lines of the windows most similar to `wanted`, best first: each file
/// line is scored against the first non-blank wanted line, the best few are
/// rescored over the whole window.
fn closest_windows(lines: &[&str], wanted: &[&str]) -> Vec<usize> {
    let Some((anchor_at, anchor)) = wanted.iter().enumerate().find(|(_, l)| !l.trim().is_empty()) else {
        return Vec::new();
    };
    let anchor = bigrams(anchor.trim());
    let mut scored: Vec<(f64, usize)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| (dice(&anchor, &bigrams(l.trim())), i))
        .filter(|&(s, i)| s >= 0.5 && i >= anchor_at)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(10);
    let whole = bigrams(&wanted.join("\n"));
    let mut windows: Vec<(f64, usize)> = scored
        .into_iter()
        .map(|(_, i)| {
            let start = i - anchor_at;
            let end = (start + wanted.len()).min(lines.len());
            (dice(&whole, &bigrams(&lines[start..end].join("\n"))), start)
        })
        .collect();
    windows.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    windows.dedup_by_key(|w| w.1);
    windows.into_iter().take(MAX_CANDIDATES).map(|(_, s)| s).collect()
}

/// Sorted character bigrams (whitespace runs count as one space).
fn bigrams(s: &str) -> Vec<(char, char)> {
    let chars: Vec<char> = s.split_whitespace().collect::<Vec<_>>().join(" ").chars().collect();
    let mut v: Vec<(char, char)> = chars.windows(2).map(|w| (w[0], w[1])).collect();
    v.sort_unstable();
    v
}

/// Dice coefficient of two sorted bigram multisets.
fn dice(a: &[(char, char)], b: &[(char, char)]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let (mut i, mut j, mut common) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
        }
    }
    2.0 * common as f64 / (a.len() + b.len()) as f64
}

/// A unified diff with 3 lines of context, capped at [`MAX_DIFF_BYTES`].
fn diff(path: &str, before: &str, after: &str) -> String {
    let d = TextDiff::configure().timeout(Duration::from_millis(500)).diff_lines(before, after);
    let mut text = d.unified_diff().context_radius(3).header(path, path).to_string();
    if text.len() > MAX_DIFF_BYTES {
        let cut = text[..MAX_DIFF_BYTES].rfind('\n').map_or(0, |i| i + 1);
        let omitted = text.len() - cut;
        text.truncate(cut);
        let _ = writeln!(text, "[... diff truncated, {omitted} more bytes]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(content: &str) -> (tempfile::TempDir, EditRequest) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.rs"), content).unwrap();
        let req = EditRequest {
            path: "f.rs".into(),
            old_string: String::new(),
            new_string: String::new(),
            replace_all: false,
            expected: None,
        };
        (dir, req)
    }

    #[test]
    fn replaces_exactly_once_and_returns_a_diff() {
        let (dir, req) = setup("fn a() {\n    1\n}\n");
        let r =
            edit(dir.path(), &EditRequest { old_string: "    1".into(), new_string: "    2".into(), ..req }).unwrap();
        assert_eq!(r.replacements, 1);
        assert_eq!(std::fs::read_to_string(dir.path().join("f.rs")).unwrap(), "fn a() {\n    2\n}\n");
        assert!(r.diff.contains("-    1\n+    2\n"), "{}", r.diff);
    }

    #[test]
    fn not_unique_lists_lines_unless_replace_all() {
        let (dir, req) = setup("x = 1\ny = 2\nx = 1\n");
        let req = EditRequest { old_string: "x = 1".into(), new_string: "x = 3".into(), ..req };
        let err = edit(dir.path(), &req).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotUnique);
        assert!(err.message.contains("occurs 2 times") && err.message.contains("lines 1, 3"), "{}", err.message);
        let r = edit(dir.path(), &EditRequest { replace_all: true, ..req }).unwrap();
        assert_eq!(r.replacements, 2);
    }

    #[test]
    fn no_match_shows_the_closest_lines_or_the_whitespace_match() {
        let content = "fn main() {\n    let total = compute(1, 2);\n    println!(\"{total}\");\n}\n";
        let (dir, req) = setup(content);
        let err = edit(
            dir.path(),
            &EditRequest { old_string: "let totl = compute(1, 3);".into(), new_string: "x".into(), ..req.clone() },
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NoMatch);
        assert!(err.message.contains("     2\t    let total = compute(1, 2);"), "{}", err.message);

        let err = edit(
            dir.path(),
            &EditRequest {
                old_string: "let total = compute(1, 2);\nprintln!(\"{total}\");".into(),
                new_string: "x".into(),
                ..req
            },
        )
        .unwrap_err();
        assert!(err.message.contains("whitespace"), "{}", err.message);
    }

    #[test]
    fn crlf_files_match_lf_old_strings() {
        let (dir, req) = setup("a\r\nb\r\nc\r\n");
        edit(dir.path(), &EditRequest { old_string: "a\nb".into(), new_string: "a\nB".into(), ..req }).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("f.rs")).unwrap(), "a\r\nB\r\nc\r\n");
    }

    #[test]
    fn refuses_binary_and_stale_versions() {
        let (dir, req) = setup("");
        std::fs::write(dir.path().join("f.rs"), b"\xff\xfe").unwrap();
        let err = edit(dir.path(), &EditRequest { old_string: "a".into(), new_string: "b".into(), ..req.clone() });
        assert_eq!(err.unwrap_err().kind, ErrorKind::NotText);
        let stale = crate::protocol::FileVersion { size: 0, mtime_ns: 0 };
        let err = edit(
            dir.path(),
            &EditRequest { old_string: "a".into(), new_string: "b".into(), expected: Some(stale), ..req },
        );
        assert_eq!(err.unwrap_err().kind, ErrorKind::Conflict);
    }
}
