//! `view`: a page of numbered lines from a file of any size.
//!
//! The output is bounded (line count, characters per line, total bytes); the
//! file is not. Finding the first line goes through the [`LineIndexCache`];
//! reading a page reads only that page, and a very long line is cut without
//! ever being held whole in memory.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::files::{io_error, regular_file, resolve, version_of};
use crate::line_index::{FileKey, LineCount, LineIndexCache, Mark, STRIDE, Stretch};
use crate::protocol::{BinaryInfo, ErrorKind, FileVersion, ToolError, ViewRequest, ViewResult};

/// How much of the start of a file is sniffed for binary content.
const SNIFF_BYTES: usize = 8 * 1024;
/// A rest of the file this small is counted before answering (a few
/// milliseconds at most), so every ordinary source file's header states its
/// total; beyond it the count goes on in the background.
const COUNT_NOW_BYTES: u64 = 4 * 1024 * 1024;

pub fn view(cache: &LineIndexCache, base: &Path, req: &ViewRequest) -> Result<ViewResult, ToolError> {
    if req.limit == 0 || req.max_line_chars == 0 || req.max_bytes == 0 {
        return Err(ToolError::new(ErrorKind::InvalidArgument, "limit, max_line_chars and max_bytes must be positive"));
    }
    let path = resolve(base, &req.path)?;
    let shown_path = path.to_string_lossy().into_owned();
    let meta = regular_file(&path)?;
    let mut file = File::open(&path).map_err(|e| io_error(&path, &e))?;
    let version = version_of(&meta);
    let key = FileKey { size: meta.len(), mtime_ns: version.mtime_ns, dev: meta.dev(), ino: meta.ino() };

    if let Some(info) = sniff_file(&path, &file, meta.len())? {
        return Ok(binary_result(shown_path, info, meta.len(), version));
    }

    let offset = req.offset.max(1);
    let located = cache.locate(&path, &file, key, offset).map_err(|e| io_error(&path, &e))?;
    let mut result = ViewResult {
        path: shown_path.clone(),
        text: String::new(),
        version,
        total_lines: 0,
        total_known: true,
        first_line: offset,
        last_line: offset - 1,
        next_offset: None,
        binary: None,
        lossy: false,
        bytes_scanned: located.bytes_scanned,
    };
    let Some(start) = located.offset else {
        // Past the end: finding that out counted every line.
        result.total_lines = cache.count(&path, key).lines;
        return past_the_end(result);
    };

    file.seek(SeekFrom::Start(start)).map_err(|e| io_error(&path, &e))?;
    let reader = (&file).take(key.size.saturating_sub(start));
    let page =
        read_page(reader, Mark { line: offset, offset: start }, key.size, req).map_err(|e| io_error(&path, &e))?;
    cache.learned(&path, key, &page.stretch);
    cache.count_rest_if_within(&path, &file, key, COUNT_NOW_BYTES).map_err(|e| io_error(&path, &e))?;
    let count = cache.count(&path, key);
    if !count.exact {
        // The rest is counted while the model reads this page.
        cache.count_in_background(&path, file, key);
    }
    let last = offset + page.lines - 1;
    if page.lines > 0 && page.stretch.to.offset < key.size {
        result.next_offset = Some(last + 1);
    }
    result.text = page_text(&shown_path, meta.len(), &count, &page, (offset, last), result.next_offset);
    result.total_lines = count.lines;
    result.total_known = count.exact;
    result.last_line = last;
    result.lossy = page.lossy;
    Ok(result)
}

/// Reads the first bytes of `file` and says whether they look binary.
fn sniff_file(path: &Path, file: &File, size: u64) -> Result<Option<BinaryInfo>, ToolError> {
    let mut probe = vec![0u8; SNIFF_BYTES.min(size as usize)];
    let n = read_at_most(file, &mut probe).map_err(|e| io_error(path, &e))?;
    probe.truncate(n);
    Ok(sniff(&probe))
}

/// What `view` answers for an offset past the last line: an empty file is
/// shown as such, any other file's offset is an error.
fn past_the_end(mut result: ViewResult) -> Result<ViewResult, ToolError> {
    let total = result.total_lines;
    if total == 0 {
        result.text = format!("{}: 0 lines, 0 bytes (empty file)\n", result.path);
        return Ok(result);
    }
    Err(ToolError::new(
        ErrorKind::InvalidArgument,
        format!("offset {} is past the end of {}, which has {total} lines", result.first_line, result.path),
    ))
}

/// What `view` answers for a binary file: its description, no lines.
fn binary_result(path: String, info: BinaryInfo, size: u64, version: FileVersion) -> ViewResult {
    let text = describe_binary(&path, &info, size);
    ViewResult {
        path,
        text,
        version,
        total_lines: 0,
        total_known: true,
        first_line: 1,
        last_line: 0,
        next_offset: None,
        binary: Some(info),
        lossy: false,
        bytes_scanned: 0,
    }
}

/// A page as the model reads it: a header with the file's size and line
/// count (or what is counted so far), the lines `shown.0` to `shown.1`, and
/// where to read on when there is more.
fn page_text(path: &str, size: u64, count: &LineCount, page: &Page, shown: (u64, u64), next: Option<u64>) -> String {
    let (first, last) = shown;
    let lossy_note = if page.lossy { " (invalid UTF-8 shown as \u{FFFD})" } else { "" };
    let mut text = if count.exact {
        format!("{path}: {} lines, {size} bytes{}{lossy_note}\n", count.lines, human_size(size))
    } else {
        format!(
            "{path}: {size} bytes{}, at least {} lines (not yet counted to the end){lossy_note}\n",
            human_size(size),
            count.lines
        )
    };
    text.push_str(&page.body);
    if let Some(next) = next {
        let of = if count.exact { format!("{}", count.lines) } else { format!("at least {}", count.lines) };
        let _ = writeln!(text, "[showing lines {first}-{last} of {of}; to read more, call view with offset={next}]");
    }
    text
}

/// ` (1.0 GiB)` for a file of a mebibyte or more: the scale at a glance.
fn human_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)];
    for (unit, scale) in UNITS {
        if bytes >= scale {
            return format!(" ({:.1} {unit})", bytes as f64 / scale as f64);
        }
    }
    String::new()
}

struct Page {
    body: String,
    lines: u64,
    /// The lines read, as the index takes them: where the page ended and
    /// the checkpoints it passed.
    stretch: Stretch,
    lossy: bool,
}

/// Reads up to `req.limit` lines from `from`, within the byte budget;
/// `reader` ends where the file's indexed size does.
fn read_page(reader: impl Read, from: Mark, size: u64, req: &ViewRequest) -> io::Result<Page> {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let max_chars = usize::try_from(req.max_line_chars).unwrap_or(usize::MAX);
    // Enough bytes for `max_chars` characters of any width, and one more to tell a cut.
    let keep = max_chars.saturating_mul(4).saturating_add(4);
    let budget = usize::try_from(req.max_bytes).unwrap_or(usize::MAX);
    let stretch = Stretch { from, to: from, ..Stretch::default() };
    let mut page = Page { body: String::new(), lines: 0, stretch, lossy: false };
    let mut raw = Vec::new();
    while page.lines < req.limit {
        let Some(line_len) = read_line_capped(&mut reader, keep, &mut raw)? else {
            page.stretch.at_end = true;
            break;
        };
        let rendered = render_line(from.line + page.lines, &raw, line_len, max_chars, &mut page.lossy);
        if page.lines > 0 && page.body.len() + rendered.len() > budget {
            break;
        }
        page.body.push_str(&rendered);
        page.lines += 1;
        let next = Mark { line: page.stretch.to.line + 1, offset: page.stretch.to.offset + line_len };
        page.stretch.to = next;
        page.stretch.bytes += line_len;
        if (next.line - 1).is_multiple_of(STRIDE) && next.offset < size {
            page.stretch.checkpoints.push(next);
        }
    }
    Ok(page)
}

/// Reads one line (through its `\n`) keeping at most `keep` bytes of it in
/// `line`; returns the line's full length in the file, `None` at end of file.
fn read_line_capped(reader: &mut impl BufRead, keep: usize, line: &mut Vec<u8>) -> io::Result<Option<u64>> {
    line.clear();
    let mut len = 0u64;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if len == 0 { None } else { Some(len) });
        }
        let (take, done) = match memchr::memchr(b'\n', buf) {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = keep.saturating_sub(line.len()).min(take);
        line.extend_from_slice(&buf[..room]);
        reader.consume(take);
        len += take as u64;
        if done {
            return Ok(Some(len));
        }
    }
}

/// `{number:>6}\t{text}\n`, the text cut at `max_chars` with a marker.
fn render_line(number: u64, raw: &[u8], full_len: u64, max_chars: usize, lossy: &mut bool) -> String {
    let complete = raw.len() as u64 == full_len;
    let mut bytes = raw;
    if complete {
        bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    } else {
        // The kept prefix may end inside a character: drop that partial character.
        bytes = match std::str::from_utf8(bytes) {
            Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
    }
    let text = String::from_utf8_lossy(bytes);
    if matches!(text, std::borrow::Cow::Owned(_)) {
        *lossy = true;
    }
    let mut out = format!("{number:>6}\t");
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => {
            out.push_str(&text[..cut]);
            let _ = write!(out, " [... line truncated at {max_chars} characters; {full_len} bytes in all]");
        }
        None if !complete => {
            out.push_str(&text);
            let _ = write!(out, " [... line truncated; {full_len} bytes in all]");
        }
        None => out.push_str(&text),
    }
    out.push('\n');
    out
}

fn read_at_most(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Recognises common binary formats by their magic numbers, and anything
/// else with a NUL byte near the start.
pub fn sniff(probe: &[u8]) -> Option<BinaryInfo> {
    let info = |kind: &str, mime: Option<&str>| BinaryInfo {
        kind: kind.into(),
        mime: mime.map(Into::into),
        width: None,
        height: None,
    };
    if probe.starts_with(b"\x89PNG\r\n\x1a\n") {
        let mut i = info("png", Some("image/png"));
        if probe.len() >= 24 && &probe[12..16] == b"IHDR" {
            i.width = Some(u32::from_be_bytes([probe[16], probe[17], probe[18], probe[19]]));
            i.height = Some(u32::from_be_bytes([probe[20], probe[21], probe[22], probe[23]]));
        }
        return Some(i);
    }
    if probe.starts_with(b"GIF87a") || probe.starts_with(b"GIF89a") {
        let mut i = info("gif", Some("image/gif"));
        if probe.len() >= 10 {
            i.width = Some(u32::from(u16::from_le_bytes([probe[6], probe[7]])));
            i.height = Some(u32::from(u16::from_le_bytes([probe[8], probe[9]])));
        }
        return Some(i);
    }
    if probe.starts_with(b"\xff\xd8\xff") {
        return Some(info("jpeg", Some("image/jpeg")));
    }
    if probe.len() >= 12 && probe.starts_with(b"RIFF") && &probe[8..12] == b"WEBP" {
        return Some(info("webp", Some("image/webp")));
    }
    if probe.starts_with(b"%PDF-") {
        return Some(info("pdf", Some("application/pdf")));
    }
    if probe.starts_with(b"\x7fELF") {
        return Some(info("elf", None));
    }
    if probe.starts_with(b"\x1f\x8b") {
        return Some(info("gzip", Some("application/gzip")));
    }
    if probe.starts_with(b"PK\x03\x04") {
        return Some(info("zip", Some("application/zip")));
    }
    if memchr::memchr(0, probe).is_some() {
        return Some(info("binary", None));
    }
    None
}

fn describe_binary(path: &str, info: &BinaryInfo, size: u64) -> String {
    let what = match info.kind.as_str() {
        "png" | "gif" | "jpeg" | "webp" => format!("{} image", info.kind.to_uppercase()),
        "pdf" => "PDF document".into(),
        "elf" => "ELF executable or library".into(),
        "gzip" => "gzip-compressed data".into(),
        "zip" => "zip archive".into(),
        _ => "binary file".into(),
    };
    let dims = match (info.width, info.height) {
        (Some(w), Some(h)) => format!(", {w}x{h}"),
        _ => String::new(),
    };
    format!("{path}: {what}{dims}, {size} bytes; binary content is not shown\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view_text(content: &[u8], req: impl FnOnce(&mut ViewRequest)) -> Result<ViewResult, ToolError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), content).unwrap();
        let mut r = ViewRequest::new("f");
        req(&mut r);
        view(&LineIndexCache::new(), dir.path(), &r)
    }

    #[test]
    fn numbered_lines_with_header_and_continuation() {
        let text: String = (1..=10).map(|i| format!("l{i}\r\n")).collect();
        let r = view_text(text.as_bytes(), |r| {
            r.offset = 3;
            r.limit = 4;
        })
        .unwrap();
        let body: Vec<&str> = r.text.lines().skip(1).collect();
        assert_eq!(
            body,
            [
                "     3\tl3",
                "     4\tl4",
                "     5\tl5",
                "     6\tl6",
                "[showing lines 3-6 of 10; to read more, call view with offset=7]"
            ]
        );
        assert!(r.text.starts_with(&r.path));
        assert_eq!((r.first_line, r.last_line, r.next_offset, r.total_lines), (3, 6, Some(7), 10));
    }

    /// A file past [`COUNT_NOW_BYTES`]: `n` lines `line N` plus padding
    /// to 100 bytes, the last one without its newline.
    fn big(dir: &Path, n: u64) -> u64 {
        let mut text = String::with_capacity(n as usize * 100);
        for i in 1..=n {
            let _ = write!(text, "line {i:<94}");
            if i < n {
                text.push('\n');
            }
        }
        std::fs::write(dir.join("big"), &text).unwrap();
        text.len() as u64
    }

    #[test]
    fn a_large_file_states_its_total_only_once_known() {
        let dir = tempfile::tempdir().unwrap();
        let n = 100_000;
        let size = big(dir.path(), n);
        assert!(size > 2 * COUNT_NOW_BYTES);
        let cache = LineIndexCache::new();
        cache.stop_counting(); // this test is about pages alone
        let view_at = |offset: u64, limit: u64| {
            let mut r = ViewRequest::new("big");
            r.offset = offset;
            r.limit = limit;
            view(&cache, dir.path(), &r).unwrap()
        };

        let first = view_at(1, 10);
        let header = first.text.lines().next().unwrap();
        assert_eq!(
            header,
            format!("{}: {size} bytes (9.5 MiB), at least 11 lines (not yet counted to the end)", first.path)
        );
        assert!(first.text.ends_with("[showing lines 1-10 of at least 11; to read more, call view with offset=11]\n"));
        assert_eq!((first.total_lines, first.total_known, first.next_offset), (11, false, Some(11)));
        assert!(!first.text.contains(&n.to_string()), "no total it does not know: {}", first.text);

        // A page within the last COUNT_NOW_BYTES: the rest is counted before answering.
        let near_end = view_at(n - 1000, 10);
        assert_eq!((near_end.total_lines, near_end.total_known), (n, true));
        assert!(near_end.text.starts_with(&format!("{}: {n} lines, {size} bytes (9.5 MiB)\n", near_end.path)));
        assert!(near_end.text.ends_with(&format!("of {n}; to read more, call view with offset={}]\n", n - 990)));

        // The last page, whose line has no newline: shown whole, nothing after it.
        let last = view_at(n, 10);
        assert!(last.text.ends_with(&format!("{n:>6}\tline {n:<94}\n")), "{}", last.text);
        assert_eq!((last.last_line, last.next_offset), (n, None));
        let past = view(&cache, dir.path(), &ViewRequest { offset: n + 1, ..ViewRequest::new("big") }).unwrap_err();
        assert!(past.message.contains(&format!("which has {n} lines")), "{}", past.message);
    }

    #[test]
    fn past_the_end_of_a_file_not_yet_counted_is_found_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let n = 100_000;
        big(dir.path(), n);
        let cache = LineIndexCache::new();
        let r = ViewRequest { offset: n + 7, ..ViewRequest::new("big") };
        let err = view(&cache, dir.path(), &r).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(
            err.message.contains(&format!("past the end of {}, which has {n} lines", dir.path().join("big").display())),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_file_changed_between_views_is_read_afresh() {
        let dir = tempfile::tempdir().unwrap();
        big(dir.path(), 100_000);
        let cache = LineIndexCache::new();
        let first =
            view(&cache, dir.path(), &ViewRequest { offset: 50_000, limit: 1, ..ViewRequest::new("big") }).unwrap();
        assert!(first.text.contains("50000\tline 50000 "));
        std::fs::write(dir.path().join("big"), "one\ntwo\n").unwrap();
        let again = view(&cache, dir.path(), &ViewRequest::new("big")).unwrap();
        assert_eq!((again.total_lines, again.total_known, again.last_line), (2, true, 2));
        assert!(again.text.ends_with("     1\tone\n     2\ttwo\n"), "{}", again.text);
    }

    #[test]
    fn long_lines_are_cut_and_the_byte_budget_ends_the_page() {
        let mut content = "é".repeat(5000).into_bytes();
        content.extend(b"\nshort\n");
        let r = view_text(&content, |r| r.max_line_chars = 10).unwrap();
        assert!(
            r.text.contains("\téééééééééé [... line truncated at 10 characters; 10001 bytes in all]\n"),
            "{}",
            r.text
        );
        assert!(r.text.contains("     2\tshort\n"));

        let content: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let r = view_text(content.as_bytes(), |r| r.max_bytes = 200).unwrap();
        assert!(r.text.len() < 400);
        assert_eq!(r.next_offset, Some(r.last_line + 1));
    }

    #[test]
    fn offsets_past_the_end_and_empty_files() {
        assert_eq!(view_text(b"a\n", |r| r.offset = 5).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert!(view_text(b"", |_| {}).unwrap().text.contains("0 lines, 0 bytes (empty file)"));
    }

    #[test]
    fn binary_files_are_described() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(640u32.to_be_bytes());
        png.extend(480u32.to_be_bytes());
        let r = view_text(&png, |_| {}).unwrap();
        assert_eq!(r.binary.as_ref().unwrap().kind, "png");
        assert!(r.text.contains("PNG image, 640x480, 24 bytes"), "{}", r.text);
        assert_eq!(sniff(b"%PDF-1.7\n").unwrap().kind, "pdf");
        assert_eq!(sniff(b"\xff\xd8\xff\xe0").unwrap().kind, "jpeg");
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 ").unwrap().kind, "webp");
        assert_eq!(sniff(b"GIF89a\x02\x00\x03\x00").unwrap().width, Some(2));
        assert_eq!(sniff(b"text\0more").unwrap().kind, "binary");
        assert!(sniff(b"plain text").is_none());
    }

    #[test]
    fn invalid_utf8_is_shown_lossily_with_a_note() {
        let r = view_text(b"caf\xe9\n", |_| {}).unwrap();
        assert!(r.lossy);
        assert!(r.text.contains("(invalid UTF-8 shown as \u{FFFD})"));
        assert!(r.text.contains("     1\tcaf\u{FFFD}\n"));
    }
}
