//! Sparse per-file line index, kept in memory for the life of the toolbox.
//!
//! What the index knows of a file grows from its start: the *frontier* is
//! the furthest line whose start is known with every line before it
//! counted. A view scans from the frontier only as far as its page needs
//! (as `sed -n 'a,bp;bq'` stops at its page), noting a checkpoint (a byte
//! offset) every [`STRIDE`] lines on the way, and the page it reads moves the
//! frontier on too. The total line count is known once the frontier reaches
//! the end of the file: the background counter ([`crate::line_count`])
//! carries it there between requests, or a later page does.
//!
//! A seek behind the frontier starts from the nearest checkpoint, or from
//! exactly where an earlier page ended, so paging through a file of any size
//! never rescans it. An entry is valid for one (size, mtime, device, inode):
//! a changed file is indexed afresh.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::line_count::{Counter, Done, STEP_BYTES};

/// Lines between checkpoints. Seeking behind the frontier costs at most
/// this many lines of scanning; the index costs 8 bytes per `STRIDE` lines
/// (a 100-million-line file: about 200 KB).
pub const STRIDE: u64 = 4096;
/// Files indexed at once; the least recently used is dropped beyond that.
const MAX_FILES: usize = 64;
/// Page ends remembered per file.
const MAX_HINTS: usize = 16;
pub(crate) const SCAN_CHUNK: usize = 256 * 1024;

/// What a cached index is valid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    pub size: u64,
    pub mtime_ns: i64,
    pub dev: u64,
    pub ino: u64,
}

/// Line `line` (1-based) starts at byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub line: u64,
    pub offset: u64,
}

impl Mark {
    pub const START: Mark = Mark { line: 1, offset: 0 };
}

/// What one pass over a stretch of a file learned: a scan for line breaks,
/// or a page read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stretch {
    pub from: Mark,
    pub to: Mark,
    /// The lines `k * STRIDE + 1` that start after `from` and at or before
    /// `to`, with their offsets, in order.
    pub checkpoints: Vec<Mark>,
    /// The pass ended at the end of the file: no line starts after `to`
    /// (`to` itself is a line only if it starts before the end).
    pub at_end: bool,
    /// Bytes examined for line breaks (reads run ahead of that by less
    /// than one read's worth, [`SCAN_CHUNK`] at most).
    pub bytes: u64,
}

impl Default for Mark {
    fn default() -> Self {
        Mark::START
    }
}

/// How many lines a file has, as far as is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineCount {
    /// The exact count if `exact`; otherwise the lines known to exist.
    pub lines: u64,
    pub exact: bool,
}

#[derive(Debug)]
struct LineIndex {
    key: FileKey,
    /// `checkpoints[k]` is the byte offset where line `k * STRIDE + 1`
    /// starts, for every such line at or before the frontier.
    checkpoints: Vec<u64>,
    frontier: Mark,
    /// Known once the frontier has reached the end of the file.
    total_lines: Option<u64>,
    /// Where recent pages ended (all at or before the frontier).
    hints: Vec<Mark>,
    last_used: u64,
}

impl LineIndex {
    fn new(key: FileKey) -> Self {
        LineIndex {
            key,
            checkpoints: vec![0],
            frontier: Mark::START,
            total_lines: (key.size == 0).then_some(0),
            hints: Vec::new(),
            last_used: 0,
        }
    }

    fn count(&self) -> LineCount {
        match self.total_lines {
            Some(lines) => LineCount { lines, exact: true },
            // Every line before the frontier, and the frontier's own if any
            // byte of it is there.
            None => LineCount {
                lines: self.frontier.line - 1 + u64::from(self.frontier.offset < self.key.size),
                exact: false,
            },
        }
    }

    /// The known position closest before `line`, which is at or before the
    /// frontier.
    fn nearest(&self, line: u64) -> Mark {
        if self.frontier.line == line {
            return self.frontier;
        }
        let k = (line - 1) / STRIDE;
        let mut best = match self.checkpoints.get(k as usize) {
            Some(&offset) => Mark { line: k * STRIDE + 1, offset },
            None => Mark::START,
        };
        for h in &self.hints {
            if h.line <= line && h.line > best.line {
                best = *h;
            }
        }
        best
    }

    /// Moves the frontier to the end of `s` if `s` covers it; checkpoints
    /// and the total come with it. A stretch behind the frontier, or one
    /// that does not reach it, teaches nothing new.
    fn absorb(&mut self, s: &Stretch) {
        let f = self.frontier;
        if self.total_lines.is_some() || s.from.offset > f.offset || s.to.offset < f.offset {
            return;
        }
        if s.to.offset == f.offset && (!s.at_end || s.to.line != f.line) {
            return;
        }
        // Checkpoints past the frontier, each the next one expected: any
        // other numbering means the file is not what the entry was built
        // from (it changed under us), and the entry keeps what it had.
        let new: Vec<u64> = s.checkpoints.iter().filter(|c| c.line > f.line).map(|c| c.offset).collect();
        let first_k = s.checkpoints.iter().find(|c| c.line > f.line).map(|c| (c.line - 1) / STRIDE);
        if first_k.is_some_and(|k| k != self.checkpoints.len() as u64) {
            return;
        }
        self.checkpoints.extend(new);
        self.frontier = s.to;
        if s.at_end || s.to.offset >= self.key.size {
            // A line starting before the end is the last one; a "line"
            // starting at the end is the empty string after a final newline.
            let last_is_line = s.to.offset < self.key.size;
            self.total_lines = Some(s.to.line - 1 + u64::from(last_is_line));
        }
    }

    fn remember(&mut self, at: Mark) {
        if at.line > self.frontier.line || self.hints.contains(&at) {
            return;
        }
        if self.hints.len() >= MAX_HINTS {
            self.hints.remove(0);
        }
        self.hints.push(at);
    }
}

/// Where a line starts, and what finding it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// Byte offset of the requested line; `None` if the file has fewer lines.
    pub offset: Option<u64>,
    /// Bytes scanned for line breaks by this call.
    pub bytes_scanned: u64,
}

/// The index of every file viewed, shared by the request threads and the
/// background counter. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct LineIndexCache {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    files: Mutex<HashMap<PathBuf, LineIndex>>,
    counter: Counter,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.counter.stop();
    }
}

impl LineIndexCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Finds where `line` (1-based) starts in `file`, whose identity is
    /// `key`, reading no further than that line. A background count of this
    /// file is stopped first: this request reads the file now, and what the
    /// count had learned is kept.
    pub fn locate(&self, path: &Path, file: &File, key: FileKey, line: u64) -> io::Result<Located> {
        let line = line.max(1);
        self.shared.counter.cancel(path);
        let (from, behind) = {
            let mut files = self.lock();
            let idx = entry(&mut files, path, key);
            if idx.total_lines.is_some_and(|total| line > total) {
                return Ok(Located { offset: None, bytes_scanned: 0 });
            }
            if line <= idx.frontier.line { (idx.nearest(line), true) } else { (idx.frontier, false) }
        };
        let stretch = scan(file, key.size, from, Some(line), u64::MAX, &|| false)?;
        if !behind {
            self.with_entry(path, key, |idx| idx.absorb(&stretch));
        }
        let found = stretch.to.line == line && stretch.to.offset < key.size;
        Ok(Located { offset: found.then_some(stretch.to.offset), bytes_scanned: stretch.bytes })
    }

    /// Takes in what a page read learned: the frontier moves on if the page
    /// went past it, and its end is remembered so the next page starts
    /// there without scanning.
    pub fn learned(&self, path: &Path, key: FileKey, page: &Stretch) {
        self.with_entry(path, key, |idx| {
            idx.absorb(page);
            if page.to.line > page.from.line {
                idx.remember(page.to);
            }
        });
    }

    /// The file's line count as far as it is known.
    pub fn count(&self, path: &Path, key: FileKey) -> LineCount {
        let mut files = self.lock();
        entry(&mut files, path, key).count()
    }

    /// Counts the rest of the file's lines now if no more than `limit` bytes
    /// of it are left to scan.
    pub fn count_rest_if_within(&self, path: &Path, file: &File, key: FileKey, limit: u64) -> io::Result<()> {
        let Some(from) = self.frontier(path, key) else { return Ok(()) };
        if key.size.saturating_sub(from.offset) > limit {
            return Ok(());
        }
        let stretch = scan(file, key.size, from, None, u64::MAX, &|| false)?;
        self.absorb(path, key, &stretch);
        Ok(())
    }

    /// Counts the rest of the file's lines on the background counter, if
    /// they are not known yet.
    pub fn count_in_background(&self, path: &Path, file: File, key: FileKey) {
        if !self.count(path, key).exact {
            // The step holds the index weakly: a dropped cache ends the count.
            let (index, owned) = (Arc::downgrade(&self.shared), path.to_path_buf());
            let step = move |stop: &dyn Fn() -> bool| match index.upgrade() {
                Some(shared) => LineIndexCache { shared }.count_step(&owned, &file, key, stop),
                None => Done::Yes,
            };
            self.shared.counter.start(path.to_path_buf(), Box::new(step));
        }
    }

    /// One step of the background count of `path`: from the frontier as it
    /// is now (a page read meanwhile may have moved it on), at most
    /// [`STEP_BYTES`], published at once.
    fn count_step(&self, path: &Path, file: &File, key: FileKey, stop: &dyn Fn() -> bool) -> Done {
        let Some(from) = self.frontier(path, key) else { return Done::Yes };
        let Ok(stretch) = scan(file, key.size, from, None, STEP_BYTES, stop) else { return Done::Yes };
        self.absorb(path, key, &stretch);
        if stretch.at_end { Done::Yes } else { Done::No }
    }

    /// Stops the background counter for good.
    pub fn stop_counting(&self) {
        self.shared.counter.stop();
    }

    /// The counter's own step: where the frontier of `path` stands, if its
    /// entry is still for `key` and its count is still wanted.
    fn frontier(&self, path: &Path, key: FileKey) -> Option<Mark> {
        let files = self.lock();
        files.get(path).filter(|i| i.key == key && i.total_lines.is_none()).map(|i| i.frontier)
    }

    /// Takes in what a stretch learned, if `path`'s entry is still for `key`
    /// (an entry dropped or rebuilt meanwhile keeps nothing of it).
    fn absorb(&self, path: &Path, key: FileKey, s: &Stretch) {
        let mut files = self.lock();
        if let Some(idx) = files.get_mut(path).filter(|i| i.key == key) {
            idx.absorb(s);
        }
    }

    fn with_entry(&self, path: &Path, key: FileKey, f: impl FnOnce(&mut LineIndex)) {
        let mut files = self.lock();
        f(entry(&mut files, path, key));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, LineIndex>> {
        self.shared.files.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The entry of `path` for `key`, new if there was none or it was for
/// another version of the file; marked as just used.
fn entry<'a>(files: &'a mut HashMap<PathBuf, LineIndex>, path: &Path, key: FileKey) -> &'a mut LineIndex {
    let clock = files.values().map(|i| i.last_used).max().unwrap_or(0) + 1;
    let fresh = files.get(path).is_none_or(|i| i.key != key);
    if fresh {
        if files.len() >= MAX_FILES
            && !files.contains_key(path)
            && let Some(oldest) = files.iter().min_by_key(|(_, i)| i.last_used).map(|(p, _)| p.clone())
        {
            files.remove(&oldest);
        }
        files.insert(path.to_path_buf(), LineIndex::new(key));
    }
    let idx = files.entry(path.to_path_buf()).or_insert_with(|| LineIndex::new(key));
    idx.last_used = clock;
    idx
}

/// From `from` (a line start), scans for line breaks until line `until`
/// starts (to the end of the file when `None`), reading at most about
/// `budget` bytes and never past `size` (a file growing meanwhile does not
/// confuse the index: its key no longer matches next time). `stop` is asked
/// between reads.
pub fn scan(
    file: &File,
    size: u64,
    from: Mark,
    until: Option<u64>,
    budget: u64,
    stop: &dyn Fn() -> bool,
) -> io::Result<Stretch> {
    let mut s = Stretch { from, to: from, ..Stretch::default() };
    let target = until.unwrap_or(u64::MAX);
    if from.line >= target {
        return Ok(s);
    }
    // A seek of a few lines needs no 256 KiB read.
    let lines = target.saturating_sub(from.line);
    let mut buf =
        vec![
            0u8;
            SCAN_CHUNK.min(usize::try_from(lines).unwrap_or(usize::MAX).saturating_mul(128).saturating_add(64 * 1024))
        ];
    let mut pos = from.offset;
    while pos < size {
        if pos - from.offset >= budget || stop() {
            break;
        }
        let want = buf.len().min(usize::try_from(size - pos).unwrap_or(usize::MAX));
        let n = read_at(file, &mut buf[..want], pos)?;
        if n == 0 {
            // Shorter than its size said: it shrank under us.
            s.at_end = true;
            break;
        }
        for i in memchr::memchr_iter(b'\n', &buf[..n]) {
            let next = Mark { line: s.to.line + 1, offset: pos + i as u64 + 1 };
            s.to = next;
            if (next.line - 1).is_multiple_of(STRIDE) && next.offset < size {
                s.checkpoints.push(next);
            }
            if next.line == target {
                s.bytes = next.offset - from.offset;
                return Ok(s);
            }
        }
        pos += n as u64;
    }
    s.at_end |= pos >= size;
    s.bytes = pos - from.offset;
    Ok(s)
}

fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, at) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
#[path = "line_index_tests.rs"]
mod tests;
