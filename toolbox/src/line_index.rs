//! Sparse per-file line index, kept in memory for the life of the toolbox.
//!
//! The first view of a file scans it once with memchr: that gives the total
//! line count for the header and a checkpoint (byte offset) every
//! [`STRIDE`] lines. Any later seek starts from the nearest checkpoint — or
//! from exactly where an earlier page ended — so paging through a file of any
//! size never rescans it. An entry is valid for one (size, mtime, inode): a
//! changed file is indexed afresh.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Lines between checkpoints. Seeking costs at most this many lines of
/// scanning; the index costs 8 bytes per `STRIDE` lines (a 100-million-line
/// file: about 200 KB).
pub const STRIDE: u64 = 4096;
/// Files indexed at once; the least recently used is dropped beyond that.
const MAX_FILES: usize = 64;
/// Page ends remembered per file.
const MAX_HINTS: usize = 16;
const SCAN_CHUNK: usize = 256 * 1024;

/// What a cached index is valid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    pub size: u64,
    pub mtime_ns: i64,
    pub dev: u64,
    pub ino: u64,
}

#[derive(Debug)]
struct LineIndex {
    key: FileKey,
    /// `checkpoints[k]` is the byte offset where line `k * STRIDE + 1` starts.
    checkpoints: Vec<u64>,
    total_lines: u64,
    /// `(line, offset)` where recent pages ended.
    hints: Vec<(u64, u64)>,
    last_used: u64,
}

impl LineIndex {
    /// The known position closest before `line`.
    fn nearest(&self, line: u64) -> (u64, u64) {
        let k = ((line - 1) / STRIDE) as usize;
        let (mut best_line, mut best_off) = match self.checkpoints.get(k) {
            Some(&off) => (k as u64 * STRIDE + 1, off),
            None => (1, 0),
        };
        for &(l, off) in &self.hints {
            if l <= line && l > best_line {
                (best_line, best_off) = (l, off);
            }
        }
        (best_line, best_off)
    }
}

/// Where a line starts, and what finding it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub total_lines: u64,
    /// Byte offset of the requested line; `None` if the file has fewer lines.
    pub offset: Option<u64>,
    /// Bytes scanned for line breaks by this call.
    pub bytes_scanned: u64,
}

#[derive(Debug, Default)]
pub struct LineIndexCache {
    files: Mutex<HashMap<PathBuf, LineIndex>>,
}

impl LineIndexCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Finds where `line` (1-based) starts in `file`, whose identity is `key`.
    pub fn locate(&self, path: &Path, file: &mut File, key: FileKey, line: u64) -> io::Result<Located> {
        let line = line.max(1);
        let mut scanned = 0;
        let cached = {
            let mut files = self.lock();
            let clock = next_clock(&files);
            match files.get_mut(path) {
                Some(idx) if idx.key == key => {
                    idx.last_used = clock;
                    Some((idx.total_lines, idx.nearest(line)))
                }
                _ => None,
            }
        };
        let (total_lines, (from_line, from_off)) = match cached {
            Some(c) => c,
            None => {
                let idx = build(file, key)?;
                scanned += key.size;
                let found = (idx.total_lines, idx.nearest(line));
                self.insert(path.to_path_buf(), idx);
                found
            }
        };
        if line > total_lines {
            return Ok(Located { total_lines, offset: None, bytes_scanned: scanned });
        }
        let (offset, cost) = skip_lines(file, from_off, line - from_line, key.size)?;
        scanned += cost;
        Ok(Located { total_lines, offset: Some(offset), bytes_scanned: scanned })
    }

    /// Records that `line` starts at `offset`, typically where a page ended,
    /// so the next page starts there without scanning.
    pub fn remember(&self, path: &Path, key: FileKey, line: u64, offset: u64) {
        let mut files = self.lock();
        if let Some(idx) = files.get_mut(path)
            && idx.key == key
            && !idx.hints.contains(&(line, offset))
        {
            if idx.hints.len() >= MAX_HINTS {
                idx.hints.remove(0);
            }
            idx.hints.push((line, offset));
        }
    }

    fn insert(&self, path: PathBuf, mut idx: LineIndex) {
        let mut files = self.lock();
        idx.last_used = next_clock(&files);
        if files.len() >= MAX_FILES
            && !files.contains_key(&path)
            && let Some(oldest) = files.iter().min_by_key(|(_, i)| i.last_used).map(|(p, _)| p.clone())
        {
            files.remove(&oldest);
        }
        files.insert(path, idx);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, LineIndex>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn next_clock(files: &HashMap<PathBuf, LineIndex>) -> u64 {
    files.values().map(|i| i.last_used).max().unwrap_or(0) + 1
}

/// One memchr pass over the first `key.size` bytes (a file growing meanwhile
/// does not confuse the index: its key no longer matches next time).
fn build(file: &mut File, key: FileKey) -> io::Result<LineIndex> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = file.take(key.size);
    let mut buf = vec![0u8; SCAN_CHUNK];
    let mut checkpoints = vec![0u64];
    let mut newlines = 0u64;
    let mut base = 0u64;
    let mut last = b'\n';
    loop {
        let n = read_some(&mut reader, &mut buf)?;
        if n == 0 {
            break;
        }
        for i in memchr::memchr_iter(b'\n', &buf[..n]) {
            newlines += 1;
            if newlines.is_multiple_of(STRIDE) {
                checkpoints.push(base + i as u64 + 1);
            }
        }
        last = buf[n - 1];
        base += n as u64;
    }
    // A last line without a final newline still counts.
    let total_lines = newlines + u64::from(base > 0 && last != b'\n');
    Ok(LineIndex { key, checkpoints, total_lines, hints: Vec::new(), last_used: 0 })
}

/// From `offset` (a line start), skips `lines` lines; returns the new offset
/// and the bytes scanned.
fn skip_lines(file: &mut File, offset: u64, lines: u64, size: u64) -> io::Result<(u64, u64)> {
    if lines == 0 {
        return Ok((offset, 0));
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = file.take(size.saturating_sub(offset));
    let mut buf = vec![0u8; SCAN_CHUNK.min(64 * 1024 + (lines as usize).saturating_mul(128))];
    let mut left = lines;
    let mut pos = offset;
    loop {
        let n = read_some(&mut reader, &mut buf)?;
        if n == 0 {
            // Fewer lines than the index said: the file changed under us.
            return Ok((pos, pos - offset));
        }
        for i in memchr::memchr_iter(b'\n', &buf[..n]) {
            left -= 1;
            if left == 0 {
                let end = pos + i as u64 + 1;
                return Ok((end, end - offset));
            }
        }
        pos += n as u64;
    }
}

fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn key_of(f: &File) -> FileKey {
        FileKey { size: f.metadata().unwrap().len(), mtime_ns: 0, dev: 0, ino: 0 }
    }

    #[test]
    fn locates_lines_across_checkpoints_and_counts_a_last_line_without_newline() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        let n = STRIDE * 3 + 10;
        for i in 1..=n {
            write!(tmp, "{i}").unwrap();
            if i < n {
                writeln!(tmp).unwrap();
            }
        }
        tmp.flush().unwrap();
        let mut f = File::open(tmp.path()).unwrap();
        let key = key_of(&f);
        let cache = LineIndexCache::new();
        let first = cache.locate(tmp.path(), &mut f, key, STRIDE * 2 + 5).unwrap();
        assert_eq!(first.total_lines, n);
        assert!(first.bytes_scanned >= key.size);
        let off = first.offset.unwrap();
        let mut s = String::new();
        f.seek(SeekFrom::Start(off)).unwrap();
        f.read_to_string(&mut s).unwrap();
        assert!(s.starts_with(&format!("{}\n", STRIDE * 2 + 5)));

        // Cached: only the few lines after the checkpoint are scanned.
        let again = cache.locate(tmp.path(), &mut f, key, STRIDE * 2 + 5).unwrap();
        assert_eq!(again.offset, Some(off));
        assert!(again.bytes_scanned < 100, "{}", again.bytes_scanned);

        // A remembered page end is an exact starting point.
        cache.remember(tmp.path(), key, STRIDE * 2 + 5, off);
        assert_eq!(cache.locate(tmp.path(), &mut f, key, STRIDE * 2 + 5).unwrap().bytes_scanned, 0);

        assert_eq!(cache.locate(tmp.path(), &mut f, key, n + 1).unwrap().offset, None);
    }

    #[test]
    fn empty_file_and_trailing_newline() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let mut f = File::open(tmp.path()).unwrap();
        let cache = LineIndexCache::new();
        let key = key_of(&f);
        assert_eq!(cache.locate(tmp.path(), &mut f, key, 1).unwrap().total_lines, 0);
        std::fs::write(tmp.path(), "a\nb\n").unwrap();
        let mut f = File::open(tmp.path()).unwrap();
        let key = FileKey { mtime_ns: 1, ..key_of(&f) };
        let loc = cache.locate(tmp.path(), &mut f, key, 2).unwrap();
        assert_eq!((loc.total_lines, loc.offset), (2, Some(2)));
    }
}
