//! `glob` and `grep` on ripgrep's crates: the same walking rules as `rg`
//! (`.gitignore`, `.ignore` respected even outside a git repository, `.git`
//! skipped, hidden files included since `.github/` and dotfiles matter to
//! coding tasks), the same regex engine, binary files skipped.

use std::io;
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::{Walk, WalkBuilder};

use crate::files::{io_error, resolve};
use crate::protocol::{ErrorKind, GlobRequest, GlobResult, GrepFile, GrepLine, GrepRequest, GrepResult, ToolError};

/// Characters of a matching line kept in a grep result.
const MAX_GREP_LINE_CHARS: usize = 500;

pub fn glob(base: &Path, req: &GlobRequest) -> Result<GlobResult, ToolError> {
    let root = search_root(base, req.path.as_deref())?;
    let matcher = PathMatcher::new(&req.pattern)?;
    let mut paths = Vec::new();
    for entry in walk(&root) {
        let Ok(entry) = entry else { continue };
        let Some(ft) = entry.file_type() else { continue };
        if ft.is_dir() || !matcher.is_match(&root, entry.path()) {
            continue;
        }
        paths.push(display(base, entry.path()));
    }
    paths.sort();
    let keep = usize::try_from(req.max_results).unwrap_or(usize::MAX);
    let omitted = paths.len().saturating_sub(keep) as u64;
    paths.truncate(keep);
    Ok(GlobResult { paths, omitted })
}

pub fn grep(base: &Path, req: &GrepRequest) -> Result<GrepResult, ToolError> {
    if req.pattern.is_empty() {
        return Err(ToolError::new(ErrorKind::InvalidArgument, "pattern must not be empty"));
    }
    let root = search_root(base, req.path.as_deref())?;
    let include = req.include.as_deref().map(PathMatcher::new).transpose()?;
    let matcher = grep_matcher(req)?;
    let context = req.context as usize;
    let mut searcher = grep_searcher(context);

    let mut result = GrepResult {
        files: Vec::new(),
        total_matches: 0,
        omitted_matches: 0,
        files_with_matches: 0,
        binary_files_skipped: 0,
    };
    let mut room = req.max_results;
    for entry in walk(&root) {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|ft| ft.is_file()) {
            continue;
        }
        if let Some(inc) = &include
            && !inc.is_match(&root, entry.path())
        {
            continue;
        }
        let mut sink = FileSink {
            lines: Vec::new(),
            matches: 0,
            binary: false,
            room: &mut room,
            context: context as u64,
            last_kept: None,
        };
        if searcher.search_path(&matcher, entry.path(), &mut sink).is_err() {
            continue; // unreadable file: skip it as rg does
        }
        let FileSink { lines, matches, binary, .. } = sink;
        if binary {
            result.binary_files_skipped += 1;
            continue;
        }
        result.total_matches += matches;
        if matches > 0 {
            result.files_with_matches += 1;
        }
        if !lines.is_empty() {
            result.files.push(GrepFile { path: display(base, entry.path()), lines });
        }
    }
    let shown: u64 = result.files.iter().flat_map(|f| &f.lines).filter(|l| l.is_match).count() as u64;
    result.omitted_matches = result.total_matches - shown;
    Ok(result)
}

fn grep_matcher(req: &GrepRequest) -> Result<RegexMatcher, ToolError> {
    RegexMatcherBuilder::new()
        .fixed_strings(req.literal)
        .case_insensitive(req.case_insensitive)
        .line_terminator(Some(b'\n'))
        .build(&req.pattern)
        .map_err(|e| ToolError::new(ErrorKind::InvalidArgument, format!("invalid pattern: {e}")))
}

/// A searcher that numbers lines, keeps `context` lines either side of a
/// match and gives up on a file at its first NUL byte (binary).
fn grep_searcher(context: usize) -> Searcher {
    SearcherBuilder::new()
        .line_number(true)
        .before_context(context)
        .after_context(context)
        .binary_detection(BinaryDetection::quit(b'\0'))
        .build()
}

/// Collects one file's matching and context lines while the shared budget
/// (`room`) lasts, and counts every match.
struct FileSink<'a> {
    lines: Vec<GrepLine>,
    matches: u64,
    binary: bool,
    room: &'a mut u64,
    context: u64,
    /// Line number of the last match kept, so its after-context is kept too.
    last_kept: Option<u64>,
}

impl Sink for FileSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, m: &SinkMatch<'_>) -> Result<bool, io::Error> {
        self.matches += 1;
        if *self.room > 0 {
            *self.room -= 1;
            let number = m.line_number().unwrap_or(0);
            self.lines.push(GrepLine { number, text: line_text(m.bytes()), is_match: true });
            self.last_kept = Some(number);
        }
        Ok(true)
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, io::Error> {
        let number = c.line_number().unwrap_or(0);
        let after_kept = self.last_kept.is_some_and(|k| number > k && number <= k + self.context);
        if *self.room > 0 || after_kept {
            self.lines.push(GrepLine { number, text: line_text(c.bytes()), is_match: false });
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        // Give back the budget this file used: its lines are dropped.
        *self.room += self.lines.iter().filter(|l| l.is_match).count() as u64;
        self.lines.clear();
        self.binary = true;
        Ok(false)
    }
}

fn line_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(MAX_GREP_LINE_CHARS) {
        Some((cut, _)) => format!("{} [... line truncated]", &text[..cut]),
        None => text.into_owned(),
    }
}

fn search_root(base: &Path, path: Option<&str>) -> Result<PathBuf, ToolError> {
    let root = match path {
        Some(p) => resolve(base, p)?,
        None => base.to_path_buf(),
    };
    std::fs::metadata(&root).map_err(|e| io_error(&root, &e))?;
    Ok(root)
}

fn walk(root: &Path) -> Walk {
    WalkBuilder::new(root)
        .hidden(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(|e| e.file_name() != ".git")
        .sort_by_file_name(|a, b| a.cmp(b))
        .build()
}

/// Paths under the workspace are shown relative to it (what `view` takes);
/// others absolute.
fn display(base: &Path, path: &Path) -> String {
    path.strip_prefix(base).unwrap_or(path).to_string_lossy().into_owned()
}

/// Glob semantics of `rg -g`/`.gitignore`: a pattern without `/` matches the
/// file name at any depth; one with `/` matches the path under the root, `*`
/// not crossing `/` and `**` crossing any number of directories.
struct PathMatcher {
    glob: GlobMatcher,
    name_only: bool,
}

impl PathMatcher {
    fn new(pattern: &str) -> Result<Self, ToolError> {
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| ToolError::new(ErrorKind::InvalidArgument, format!("invalid glob: {e}")))?
            .compile_matcher();
        Ok(PathMatcher { glob, name_only: !pattern.contains('/') })
    }

    fn is_match(&self, root: &Path, path: &Path) -> bool {
        let rel = path.strip_prefix(root).unwrap_or(path);
        if self.name_only || rel.as_os_str().is_empty() {
            path.file_name().is_some_and(|n| self.glob.is_match(n))
        } else {
            self.glob.is_match(rel)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for d in ["src/a", ".git", "target", ".github"] {
            fs::create_dir_all(p.join(d)).unwrap();
        }
        fs::write(p.join(".gitignore"), "target/\n*.log\n").unwrap();
        fs::write(p.join("src/main.rs"), "fn main() {\n    needle();\n}\n").unwrap();
        fs::write(p.join("src/a/lib.rs"), "// needle\n").unwrap();
        fs::write(p.join("target/out.rs"), "needle\n").unwrap();
        fs::write(p.join("debug.log"), "needle\n").unwrap();
        fs::write(p.join(".git/config.rs"), "needle\n").unwrap();
        fs::write(p.join(".github/ci.yml"), "needle: true\n").unwrap();
        fs::write(p.join("bin.dat"), b"needle\0\x01").unwrap();
        dir
    }

    #[test]
    fn glob_respects_gitignore_skips_git_and_keeps_hidden_dirs() {
        let dir = tree();
        let r = glob(dir.path(), &GlobRequest { pattern: "*.rs".into(), path: None, max_results: 100 }).unwrap();
        assert_eq!(r.paths, ["src/a/lib.rs", "src/main.rs"]);
        let r = glob(dir.path(), &GlobRequest { pattern: "src/*.rs".into(), path: None, max_results: 100 }).unwrap();
        assert_eq!(r.paths, ["src/main.rs"]);
        let r = glob(dir.path(), &GlobRequest { pattern: "**/*.yml".into(), path: None, max_results: 100 }).unwrap();
        assert_eq!(r.paths, [".github/ci.yml"]);
        let r =
            glob(dir.path(), &GlobRequest { pattern: "*".into(), path: Some("src".into()), max_results: 1 }).unwrap();
        assert_eq!((r.paths.len(), r.omitted), (1, 1));
    }

    #[test]
    fn grep_finds_matches_with_context_and_skips_ignored_and_binary_files() {
        let dir = tree();
        let req = GrepRequest {
            pattern: "needle".into(),
            path: None,
            include: None,
            literal: true,
            case_insensitive: false,
            context: 1,
            max_results: 100,
        };
        let r = grep(dir.path(), &req).unwrap();
        let files: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files, [".github/ci.yml", "src/a/lib.rs", "src/main.rs"]);
        assert_eq!(r.binary_files_skipped, 1);
        assert_eq!(r.total_matches, 3);
        let main = &r.files[2];
        assert_eq!(
            main.lines,
            [
                GrepLine { number: 1, text: "fn main() {".into(), is_match: false },
                GrepLine { number: 2, text: "    needle();".into(), is_match: true },
                GrepLine { number: 3, text: "}".into(), is_match: false },
            ]
        );
        let r = grep(dir.path(), &GrepRequest { include: Some("*.rs".into()), max_results: 1, ..req.clone() }).unwrap();
        assert_eq!((r.total_matches, r.omitted_matches, r.files_with_matches), (2, 1, 2));
        let err = grep(dir.path(), &GrepRequest { pattern: "(".into(), literal: false, ..req }).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }
}
