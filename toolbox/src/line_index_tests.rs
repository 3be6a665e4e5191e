use std::io::Write;
use std::time::{Duration, Instant};

use super::*;

/// `n` lines `1\n2\n…`, the last without its newline if `open_end`.
fn numbered(n: u64, open_end: bool) -> tempfile::NamedTempFile {
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    let mut text = String::new();
    for i in 1..=n {
        text.push_str(&i.to_string());
        if i < n || !open_end {
            text.push('\n');
        }
    }
    tmp.write_all(text.as_bytes()).unwrap();
    tmp.flush().unwrap();
    tmp
}

fn key_of(f: &File) -> FileKey {
    FileKey { size: f.metadata().unwrap().len(), mtime_ns: 0, dev: 0, ino: 0 }
}

fn line_at(f: &File, offset: u64) -> String {
    let mut buf = vec![0u8; 32];
    let n = f.read_at(&mut buf, offset).unwrap();
    String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_owned()
}

/// Polls `cond` until it holds, failing after a generous deadline.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_line_near_the_start_reads_no_further_and_the_count_stays_a_lower_bound() {
    let n = STRIDE * 20;
    let tmp = numbered(n, false);
    let f = File::open(tmp.path()).unwrap();
    let key = key_of(&f);
    let cache = LineIndexCache::new();
    let loc = cache.locate(tmp.path(), &f, key, 100).unwrap();
    assert_eq!(line_at(&f, loc.offset.unwrap()), "100");
    // 99 lines of at most 3 digits and a newline.
    assert!(loc.bytes_scanned < 400, "{}", loc.bytes_scanned);
    let count = cache.count(tmp.path(), key);
    assert_eq!(count, LineCount { lines: 100, exact: false });
}

#[test]
fn far_lines_leave_checkpoints_and_lines_behind_the_frontier_are_found_from_them() {
    let n = STRIDE * 10;
    let tmp = numbered(n, false);
    let f = File::open(tmp.path()).unwrap();
    let key = key_of(&f);
    let cache = LineIndexCache::new();
    let far = STRIDE * 8 + 7;
    let first = cache.locate(tmp.path(), &f, key, far).unwrap();
    assert_eq!(line_at(&f, first.offset.unwrap()), far.to_string());
    assert!(first.bytes_scanned < key.size, "stopped at the line, not the end");
    assert!(!cache.count(tmp.path(), key).exact);

    // Behind the frontier: from the checkpoint at STRIDE * 3 + 1, not from the start.
    let back = cache.locate(tmp.path(), &f, key, STRIDE * 3 + 10).unwrap();
    assert_eq!(line_at(&f, back.offset.unwrap()), (STRIDE * 3 + 10).to_string());
    assert!(back.bytes_scanned < 100, "{}", back.bytes_scanned);

    // The frontier itself is an exact starting point.
    assert_eq!(cache.locate(tmp.path(), &f, key, far).unwrap().bytes_scanned, 0);
}

#[test]
fn past_the_end_counts_every_line_with_or_without_a_final_newline() {
    for open_end in [false, true] {
        let n = STRIDE * 2 + 3;
        let tmp = numbered(n, open_end);
        let f = File::open(tmp.path()).unwrap();
        let key = key_of(&f);
        let cache = LineIndexCache::new();
        let last = cache.locate(tmp.path(), &f, key, n).unwrap();
        assert_eq!(line_at(&f, last.offset.unwrap()), n.to_string(), "open_end={open_end}");
        assert_eq!(cache.locate(tmp.path(), &f, key, n + 1).unwrap().offset, None, "open_end={open_end}");
        assert_eq!(cache.count(tmp.path(), key), LineCount { lines: n, exact: true }, "open_end={open_end}");
        assert_eq!(cache.locate(tmp.path(), &f, key, n + 50).unwrap(), Located { offset: None, bytes_scanned: 0 });
    }
}

#[test]
fn an_empty_file_has_no_lines_and_a_lone_newline_has_one() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let f = File::open(tmp.path()).unwrap();
    let cache = LineIndexCache::new();
    let key = key_of(&f);
    assert_eq!(cache.locate(tmp.path(), &f, key, 1).unwrap().offset, None);
    assert_eq!(cache.count(tmp.path(), key), LineCount { lines: 0, exact: true });

    std::fs::write(tmp.path(), "\n").unwrap();
    let f = File::open(tmp.path()).unwrap();
    let key = FileKey { mtime_ns: 1, ..key_of(&f) };
    assert_eq!(cache.locate(tmp.path(), &f, key, 1).unwrap().offset, Some(0));
    assert_eq!(cache.locate(tmp.path(), &f, key, 2).unwrap().offset, None);
    assert_eq!(cache.count(tmp.path(), key), LineCount { lines: 1, exact: true });
}

#[test]
fn crlf_and_very_long_lines_count_by_newline() {
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    let long = "y".repeat(3 * SCAN_CHUNK + 17);
    write!(tmp, "a\r\n{long}\r\nb\r\n\r\nc").unwrap();
    tmp.flush().unwrap();
    let f = File::open(tmp.path()).unwrap();
    let key = key_of(&f);
    let cache = LineIndexCache::new();
    let b = cache.locate(tmp.path(), &f, key, 3).unwrap();
    assert_eq!(line_at(&f, b.offset.unwrap()), "b");
    assert!(b.bytes_scanned >= long.len() as u64);
    assert_eq!(line_at(&f, cache.locate(tmp.path(), &f, key, 5).unwrap().offset.unwrap()), "c");
    assert_eq!(cache.locate(tmp.path(), &f, key, 6).unwrap().offset, None);
    assert_eq!(cache.count(tmp.path(), key), LineCount { lines: 5, exact: true });
}

#[test]
fn the_background_count_reaches_the_exact_total() {
    let n = STRIDE * 50 + 1;
    let tmp = numbered(n, true);
    let f = File::open(tmp.path()).unwrap();
    let key = key_of(&f);
    let cache = LineIndexCache::new();
    cache.locate(tmp.path(), &f, key, 10).unwrap();
    assert!(!cache.count(tmp.path(), key).exact);
    cache.count_in_background(tmp.path(), f.try_clone().unwrap(), key);
    wait_for("the count", || cache.count(tmp.path(), key).exact);
    assert_eq!(cache.count(tmp.path(), key).lines, n);
    // Its checkpoints are the index's: a line far in is found from one.
    let far = cache.locate(tmp.path(), &f, key, STRIDE * 49 + 2).unwrap();
    assert_eq!(line_at(&f, far.offset.unwrap()), (STRIDE * 49 + 2).to_string());
    assert!(far.bytes_scanned < 100, "{}", far.bytes_scanned);
}

#[test]
fn a_changed_file_is_indexed_afresh_whatever_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, "1\n2\n3\n").unwrap();
    let cache = LineIndexCache::new();
    let key_now = || {
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        FileKey { size: meta.len(), mtime_ns: crate::files::mtime_ns(&meta), dev: meta.dev(), ino: meta.ino() }
    };
    let total = |cache: &LineIndexCache| {
        let f = File::open(&path).unwrap();
        let key = key_now();
        cache.locate(&path, &f, key, u64::MAX).unwrap();
        cache.count(&path, key)
    };
    assert_eq!(total(&cache), LineCount { lines: 3, exact: true });
    let stamp = std::fs::metadata(&path).unwrap().modified().unwrap();

    // Another size.
    std::fs::write(&path, "1\n2\n3\n4\n").unwrap();
    assert_eq!(total(&cache).lines, 4);
    // The same size, another mtime.
    std::fs::write(&path, "1\n\n\n\n\n").unwrap();
    let set_time = |t| File::options().write(true).open(&path).unwrap().set_modified(t).unwrap();
    set_time(stamp + Duration::from_secs(5));
    assert_eq!(total(&cache).lines, 5);
    // The same size and mtime, another inode (replaced by a rename).
    let other = dir.path().join("g");
    std::fs::write(&other, "12\n4\n678\n").unwrap();
    File::options().write(true).open(&other).unwrap().set_modified(stamp + Duration::from_secs(5)).unwrap();
    std::fs::rename(&other, &path).unwrap();
    assert_eq!(total(&cache).lines, 3);
}

#[test]
fn only_a_stretch_that_covers_the_frontier_moves_it() {
    let key = FileKey { size: 10 * STRIDE * 2, mtime_ns: 0, dev: 0, ino: 0 };
    let mut idx = LineIndex::new(key);
    let at = |line: u64| Mark { line, offset: (line - 1) * 2 };
    let checkpoints =
        |from: u64, to: u64| (from + 1..=to).filter(|l| (l - 1).is_multiple_of(STRIDE)).map(at).collect::<Vec<_>>();
    let stretch = |from: u64, to: u64| Stretch {
        from: at(from),
        to: at(to),
        checkpoints: checkpoints(from, to),
        ..Stretch::default()
    };
    // Not reaching the frontier from the start: nothing learned.
    idx.absorb(&stretch(5, STRIDE + 10));
    assert_eq!(idx.frontier, Mark::START);
    idx.absorb(&stretch(1, STRIDE + 10));
    assert_eq!((idx.frontier, idx.checkpoints.len()), (at(STRIDE + 10), 2));
    // Behind it: nothing; across it: on, with the checkpoint past it.
    idx.absorb(&stretch(3, 50));
    assert_eq!(idx.frontier, at(STRIDE + 10));
    idx.absorb(&stretch(STRIDE, 2 * STRIDE + 5));
    assert_eq!(
        (idx.frontier, idx.checkpoints.clone()),
        (at(2 * STRIDE + 5), vec![0, at(STRIDE + 1).offset, at(2 * STRIDE + 1).offset])
    );
    // Numbering that does not follow on (the file changed under a scan): kept out.
    let mut odd = stretch(2 * STRIDE, 4 * STRIDE + 5);
    odd.checkpoints.remove(1);
    idx.absorb(&odd);
    assert_eq!(idx.frontier, at(2 * STRIDE + 5));
    // A page end is remembered only at or behind the frontier.
    idx.remember(at(3 * STRIDE));
    idx.remember(at(100));
    assert_eq!(idx.hints, vec![at(100)]);
    assert_eq!(idx.nearest(150), at(100));
}
