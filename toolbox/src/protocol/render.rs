//! Model-facing renderings of the structured results: pure functions, so the
//! worker can call them without the toolbox.

use super::{FileKind, GlobResult, GrepResult, LsResult};

impl LsResult {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            match e.kind {
                FileKind::Dir => out.push_str(&format!("{}/\n", e.name)),
                FileKind::Symlink => out.push_str(&format!("{}@\n", e.name)),
                FileKind::File | FileKind::Other => out.push_str(&format!("{}\t{} bytes\n", e.name, e.size)),
            }
        }
        if self.entries.is_empty() {
            out.push_str("(empty directory)\n");
        }
        if self.omitted > 0 {
            out.push_str(&format!("[... {} more entries not shown]\n", self.omitted));
        }
        out
    }
}

impl GlobResult {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.paths {
            out.push_str(p);
            out.push('\n');
        }
        if self.paths.is_empty() {
            out.push_str("no files matched\n");
        }
        if self.omitted > 0 {
            out.push_str(&format!("[... {} more files not shown; narrow the pattern]\n", self.omitted));
        }
        out
    }
}

impl GrepResult {
    /// ripgrep-like: `path:line:text` for matches, `path-line-text` for context.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            let mut prev: Option<u64> = None;
            for l in &f.lines {
                if prev.is_some_and(|p| l.number > p + 1) {
                    out.push_str("--\n");
                }
                let sep = if l.is_match { ':' } else { '-' };
                out.push_str(&format!("{}{sep}{}{sep}{}\n", f.path, l.number, l.text));
                prev = Some(l.number);
            }
        }
        if self.total_matches == 0 {
            out.push_str("no matches\n");
        }
        if self.omitted_matches > 0 {
            out.push_str(&format!(
                "[... {} more matching lines not shown ({} matches in {} files in all); narrow the search]\n",
                self.omitted_matches, self.total_matches, self.files_with_matches
            ));
        }
        out
    }
}
