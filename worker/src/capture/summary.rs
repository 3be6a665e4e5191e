//! Reading git's `--raw -z` listing (one diff's raw records), with each
//! file's line counts either after it (`--numstat -z`, when the patch was
//! too large to send) or read off the patch ([`super::count`]), as the
//! sandbox produced it: hostile input. It is cut to a number of entries and
//! a path length; a record cut short at the end is dropped.

use kiln_protocol::changes::{ChangeTotals, FileChange, FileStatus};

use super::count::Counts;

/// Most files a summary lists.
pub const MAX_FILES: usize = 10_000;
/// Longest path kept (bytes); longer ones are cut, marked with `…`.
pub const MAX_PATH: usize = 4096;

/// The per-file summary and its totals (over the files listed): the
/// counts are the listing's own (`--numstat`) when it has them, else
/// `counted`, the patch's sections in the listing's order (a type change is
/// two sections, its deletion and its creation, as `--numstat` sums them).
pub fn summarise(listing: &[u8], counted: Option<&[Counts]>) -> (Vec<FileChange>, ChangeTotals) {
    let mut fields = fields(listing).peekable();
    let statuses = parse_raw(&mut fields);
    let mut counts = parse_numstat(fields).into_iter().peekable();
    let mut sections = counted.filter(|_| counts.peek().is_none()).unwrap_or_default().iter();
    let mut totals = ChangeTotals::default();
    let files: Vec<FileChange> = statuses
        .into_iter()
        .map(|(status, old_path, path)| {
            let parts = if status == FileStatus::TypeChanged { 2 } else { 1 };
            let section = sections.by_ref().take(parts).fold(None, |sum: Option<Counts>, c| {
                let s = sum.unwrap_or_default();
                Some(Counts {
                    additions: s.additions.saturating_add(c.additions),
                    deletions: s.deletions.saturating_add(c.deletions),
                    binary: s.binary || c.binary,
                })
            });
            // Both parts come from one diff, in one order; a count whose
            // path differs is not this file's.
            let (additions, deletions, binary) = match section {
                Some(c) => (c.additions, c.deletions, c.binary),
                None => counts.next().filter(|c| c.3 == path).map_or((0, 0, false), |c| (c.0, c.1, c.2)),
            };
            totals.files += 1;
            totals.additions = totals.additions.saturating_add(additions);
            totals.deletions = totals.deletions.saturating_add(deletions);
            FileChange { path, old_path, status, additions, deletions, binary }
        })
        .collect();
    (files, totals)
}

/// `(status, old path, path)` per raw record (`:<modes> <ids> <status>`,
/// then one path, or two for a rename or copy); stops at the first field
/// that is not one, where the counts begin.
fn parse_raw<'a>(
    fields: &mut std::iter::Peekable<impl Iterator<Item = &'a [u8]>>,
) -> Vec<(FileStatus, Option<String>, String)> {
    let mut out = Vec::new();
    while out.len() < MAX_FILES {
        let Some(record) = fields.next_if(|f| f.first() == Some(&b':')) else { break };
        let code = record.rsplit(|b| *b == b' ').next().unwrap_or_default();
        let (status, two_paths) = match code.first() {
            Some(b'A') => (FileStatus::Added, false),
            Some(b'D') => (FileStatus::Deleted, false),
            Some(b'T') => (FileStatus::TypeChanged, false),
            Some(b'R') => (FileStatus::Renamed, true),
            Some(b'C') => (FileStatus::Copied, true),
            Some(b'M' | b'U' | b'X' | b'B') => (FileStatus::Modified, false),
            _ => break,
        };
        let Some(first) = fields.next() else { break };
        let entry = if two_paths {
            let Some(second) = fields.next() else { break };
            (status, Some(path(first)), path(second))
        } else {
            (status, None, path(first))
        };
        out.push(entry);
    }
    out
}

/// `(additions, deletions, binary, path)` per file; a rename's path is its
/// new one.
fn parse_numstat<'a>(mut fields: impl Iterator<Item = &'a [u8]>) -> Vec<(u64, u64, bool, String)> {
    let mut out = Vec::new();
    while out.len() < MAX_FILES {
        let Some(head) = fields.next() else { break };
        let mut parts = head.splitn(3, |b| *b == b'\t');
        let (Some(a), Some(d), Some(rest)) = (parts.next(), parts.next(), parts.next()) else { break };
        let binary = a == b"-" && d == b"-";
        let count = |t: &[u8]| std::str::from_utf8(t).ok().and_then(|t| t.parse::<u64>().ok());
        let (additions, deletions) = match (binary, count(a), count(d)) {
            (true, _, _) => (0, 0),
            (false, Some(a), Some(d)) => (a, d),
            _ => break,
        };
        // A rename: an empty path here, then the old and new paths.
        let file = if rest.is_empty() {
            let (Some(_old), Some(new)) = (fields.next(), fields.next()) else { break };
            path(new)
        } else {
            path(rest)
        };
        out.push((additions, deletions, binary, file));
    }
    out
}

/// The NUL-terminated fields; an unterminated last one (the output was cut)
/// is left out.
fn fields(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let complete = bytes.iter().rposition(|b| *b == 0).map_or(&bytes[..0], |end| &bytes[..end]);
    complete.split(|b| *b == 0).filter(|_| !complete.is_empty())
}

fn path(bytes: &[u8]) -> String {
    if bytes.len() <= MAX_PATH {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut cut = String::from_utf8_lossy(&bytes[..MAX_PATH]).into_owned();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_kind_of_entry() {
        let raw = [
            ":100644 100644 1111111 2222222 M\0a.txt\0",
            ":100644 100644 3333333 3333333 R087\0old name\0new name\0",
            ":000000 100644 0000000 4444444 A\0img.png\0",
            ":100644 000000 5555555 0000000 D\0gone\0",
            ":100644 120000 6666666 7777777 T\0link\0",
        ]
        .concat();
        let numstat = "1\t2\ta.txt\x003\t0\t\0old name\0new name\0-\t-\timg.png\x000\t4\tgone\x001\t1\tlink\0";
        let (files, totals) = summarise((raw + numstat).as_bytes(), None);
        assert_eq!(files.len(), 5);
        assert_eq!(files[1].status, FileStatus::Renamed);
        assert_eq!(files[1].old_path.as_deref(), Some("old name"));
        assert_eq!(files[1].path, "new name");
        assert_eq!(files[1].additions, 3);
        assert!(files[2].binary && files[2].status == FileStatus::Added);
        assert_eq!(totals, ChangeTotals { files: 5, additions: 5, deletions: 7 });
    }

    #[test]
    fn garbage_and_cut_output_never_panic() {
        for input in [&b""[..], b"\0\0\0", b":\0x\0", b":x R100\0only-one", b":x M\0a", b"\xff\xfe\0\x00", b"1\t1\t\0"]
        {
            let _ = summarise(input, None);
        }
        let (files, _) = summarise(b":x M\0a\0:x M\0b", None);
        assert_eq!(files.len(), 1, "the cut last record is dropped");
        let (files, _) = summarise(b":x M\0a\0x\ty\tz\0", None);
        assert_eq!((files[0].additions, files[0].deletions), (0, 0), "a malformed count counts nothing");
        let (files, _) = summarise(b":x M\0a\0:x M\0b\x003\t1\tb\0", None);
        assert_eq!((files[0].additions, files[1].additions), (0, 0), "a count whose path differs is not the file's");
        let long = vec![b'a'; MAX_PATH * 2];
        let input = [b":x A\0".as_slice(), &long, b"\0"].concat();
        assert_eq!(summarise(&input, None).0[0].path.len(), MAX_PATH + '…'.len_utf8());
    }

    #[test]
    fn counts_read_off_the_patch_go_to_the_files_in_order() {
        let raw = ":x M\0a\0:x T\0link\0:x A\0bin\0";
        let c = |additions, deletions, binary| Counts { additions, deletions, binary };
        let counted = [c(1, 2, false), c(0, 3, false), c(1, 0, false), c(0, 0, true)];
        let (files, totals) = summarise(raw.as_bytes(), Some(&counted));
        let got: Vec<_> = files.iter().map(|f| (f.additions, f.deletions, f.binary)).collect();
        assert_eq!(got, [(1, 2, false), (1, 3, false), (0, 0, true)], "a type change sums its two sections");
        assert_eq!(totals, ChangeTotals { files: 3, additions: 2, deletions: 5 });
        let (files, _) = summarise(format!("{raw}5\t6\ta\0").as_bytes(), Some(&counted));
        assert_eq!((files[0].additions, files[0].deletions), (5, 6), "the listing's own counts come first");
        let (files, _) = summarise(raw.as_bytes(), Some(&counted[..1]));
        assert_eq!((files[2].additions, files[2].binary), (0, false), "a file without a section counts nothing");
    }

    #[test]
    fn the_number_of_files_is_capped() {
        let input: Vec<u8> = (0..MAX_FILES + 5).flat_map(|i| format!(":x A\0f{i}\0").into_bytes()).collect();
        assert_eq!(summarise(&input, None).0.len(), MAX_FILES);
    }
}
