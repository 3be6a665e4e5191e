//! Reading and writing single files when the sandbox has no toolbox: one
//! `docker exec` as the command user, content passed byte for byte as
//! the command's stdout or stdin (no shell quoting of content; the path is
//! an argument). Not the archive API: that acts as root inside the
//! container, so a symlink in the workspace (`ln -s /etc x`, then view
//! `x/shadow`) would reach files the user cannot.

use std::time::Duration;

use super::{Sandbox, SandboxError, WORKSPACE};

/// Longest a single file transfer may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads `$1` up to `$2` bytes. Exit 2: no such file; 21: a directory;
/// 27: larger than `$2` (its size on stderr); otherwise `cat`'s own error.
const READ_SCRIPT: &str = r#"p=$1
if [ -d "$p" ]; then exit 21; fi
if [ ! -e "$p" ] && [ ! -L "$p" ]; then exit 2; fi
size=$(stat -L -c %s -- "$p" 2>/dev/null) || exec cat -- "$p"
if [ "$size" -gt "$2" ]; then echo "$size" >&2; exit 27; fi
exec cat -- "$p""#;

/// Prints one page of `$1` without reading past it: its size, the NUL
/// bytes among its first 8 KiB (binary or not), then for each line from `$2`
/// through `$3` its length and its first `$4` bytes (tab-separated), and a
/// last line `end N` (the file has N lines) or `more N` (it goes on after
/// line N). Exit 2: no such file; 21: a directory; 13: not readable.
const PAGE_SCRIPT: &str = r#"p=$1
if [ -d "$p" ]; then exit 21; fi
if [ ! -e "$p" ] && [ ! -L "$p" ]; then exit 2; fi
if [ ! -r "$p" ]; then echo "$p: Permission denied" >&2; exit 13; fi
stat -L -c %s -- "$p" || exit 1
head -c 8192 < "$p" | tr -dc '\000' | wc -c
LC_ALL=C exec awk -v a="$2" -v b="$3" -v c="$4" '
NR >= a && NR <= b { print length($0) "\t" substr($0, 1, c) }
NR > b { more = 1; exit }
END { print (more ? "more " : "end ") NR }' < "$p""#;

/// One page of a file as [`Sandbox::read_page`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePage {
    pub size: u64,
    /// NUL bytes in the first 8 KiB: a binary file.
    pub binary: bool,
    /// Each line's length in bytes and its first bytes.
    pub lines: Vec<(u64, Vec<u8>)>,
    /// Lines the file has (`exact`), or that it has at least.
    pub total: u64,
    pub exact: bool,
}

/// Writes stdin to `$1`, creating its directory first.
const WRITE_SCRIPT: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

/// A file problem the model can act on.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("no such file: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDirectory(String),
    #[error("{path} is {size} bytes; files over {limit} bytes cannot be read whole yet")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("invalid path {0:?}")]
    InvalidPath(String),
    /// What the command user may not do (permissions, a full disk, …).
    #[error("{path}: {reason}")]
    Refused { path: String, reason: String },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Resolves a model-supplied path: relative paths are under `/workspace`.
pub fn resolve(path: &str) -> Result<String, FileError> {
    if path.is_empty() || path.contains('\0') {
        return Err(FileError::InvalidPath(path.to_owned()));
    }
    Ok(if path.starts_with('/') { path.to_owned() } else { format!("{WORKSPACE}/{path}") })
}

impl Sandbox {
    /// Reads a whole file, up to `limit` bytes, as the command user.
    pub async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>, FileError> {
        let abs = resolve(path)?;
        let limit_arg = limit.to_string();
        let argv = ["sh", "-c", READ_SCRIPT, "sh", abs.as_str(), limit_arg.as_str()];
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let out = self.exec_raw(&argv, None, cap, TRANSFER_TIMEOUT).await?;
        if out.overflow {
            // Grew while being read.
            return Err(FileError::TooLarge { path: path.to_owned(), size: limit.saturating_add(1), limit });
        }
        match out.exit_code {
            Some(0) => Ok(out.stdout),
            Some(2) => Err(FileError::NotFound(path.to_owned())),
            Some(21) => Err(FileError::IsDirectory(path.to_owned())),
            Some(27) => {
                let size = out.stderr.trim().parse().unwrap_or(limit.saturating_add(1));
                Err(FileError::TooLarge { path: path.to_owned(), size, limit })
            }
            _ => Err(refused(path, &out.stderr)),
        }
    }

    /// Lines `first..=last` of a file, each cut to `keep` bytes, as the
    /// command user, reading no further into the file than the line after
    /// `last` (what the view tool does without a toolbox).
    pub async fn read_page(&self, path: &str, first: u64, last: u64, keep: u64) -> Result<FilePage, FileError> {
        let abs = resolve(path)?;
        let (a, b, c) = (first.to_string(), last.to_string(), keep.to_string());
        let argv = ["sh", "-c", PAGE_SCRIPT, "sh", abs.as_str(), a.as_str(), b.as_str(), c.as_str()];
        // Every line is cut to `keep`, plus its length and a tab.
        let lines = usize::try_from(last.saturating_sub(first).saturating_add(1)).unwrap_or(usize::MAX);
        let cap =
            lines.saturating_mul(usize::try_from(keep).unwrap_or(usize::MAX).saturating_add(24)).saturating_add(256);
        let out = self.exec_raw(&argv, None, cap, TRANSFER_TIMEOUT).await?;
        match out.exit_code {
            Some(0) if !out.overflow => {
                parse_page(&out.stdout).ok_or_else(|| refused(path, "the page could not be read"))
            }
            Some(2) => Err(FileError::NotFound(path.to_owned())),
            Some(21) => Err(FileError::IsDirectory(path.to_owned())),
            _ => Err(refused(path, &out.stderr)),
        }
    }

    /// Writes a file (creating parent directories) as the command user.
    pub async fn write_file(&self, path: &str, content: &[u8]) -> Result<(), FileError> {
        let abs = resolve(path)?;
        let name = abs.rsplit('/').next().unwrap_or_default();
        if name.is_empty() || name == "." || name == ".." {
            return Err(FileError::InvalidPath(path.to_owned()));
        }
        let argv = ["sh", "-c", WRITE_SCRIPT, "sh", abs.as_str()];
        let out = self.exec_raw(&argv, Some(content), 0, TRANSFER_TIMEOUT).await?;
        match out.exit_code {
            Some(0) => Ok(()),
            _ if out.stderr.contains("Is a directory") => Err(FileError::IsDirectory(path.to_owned())),
            _ => Err(refused(path, &out.stderr)),
        }
    }
}

/// [`PAGE_SCRIPT`]'s output; `None` if it is not that shape.
fn parse_page(out: &[u8]) -> Option<FilePage> {
    let mut rows: Vec<&[u8]> = out.split(|&b| b == b'\n').collect();
    if rows.last().is_some_and(|r| r.is_empty()) {
        rows.pop();
    }
    let number = |row: &[u8]| std::str::from_utf8(row).ok()?.trim().parse::<u64>().ok();
    let size = number(rows.first()?)?;
    let binary = number(rows.get(1)?)? > 0;
    let trailer = std::str::from_utf8(rows.last()?).ok()?;
    let (word, n) = trailer.split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let exact = match word {
        "end" => true,
        "more" => false,
        _ => return None,
    };
    let mut lines = Vec::new();
    for row in rows.get(2..rows.len() - 1)? {
        let tab = row.iter().position(|&b| b == b'\t')?;
        lines.push((number(&row[..tab])?, row[tab + 1..].to_vec()));
    }
    Some(FilePage { size, binary, lines, total: n, exact })
}

/// The failing command's own words, without the `cat: <path>: ` prefix.
fn refused(path: &str, stderr: &str) -> FileError {
    let line = stderr.lines().last().unwrap_or("").trim();
    let reason = line.rsplit(": ").next().filter(|r| !r.is_empty()).unwrap_or("the command failed");
    FileError::Refused { path: path.to_owned(), reason: reason.to_owned() }
}

pub(crate) fn parse_user(user: &str) -> (u64, u64) {
    let mut it = user.split(':');
    let uid = it.next().and_then(|u| u.parse().ok()).unwrap_or(1000);
    let gid = it.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
    (uid, gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_land_in_the_workspace() {
        assert_eq!(resolve("a/b.txt").unwrap(), "/workspace/a/b.txt");
        assert_eq!(resolve("/etc/hosts").unwrap(), "/etc/hosts");
        assert!(resolve("").is_err());
        assert!(resolve("a\0b").is_err());
    }

    #[test]
    fn a_page_is_parsed_with_its_lines_and_whether_the_file_goes_on() {
        let page = parse_page(b"1234\n0\n3\tabc\n0\t\n5\tx\ty\tz\nmore 6\n").unwrap();
        assert_eq!((page.size, page.binary, page.total, page.exact), (1234, false, 6, false));
        assert_eq!(page.lines, vec![(3, b"abc".to_vec()), (0, vec![]), (5, b"x\ty\tz".to_vec())]);
        let empty = parse_page(b"0\n0\nend 0\n").unwrap();
        assert_eq!((empty.lines.len(), empty.total, empty.exact), (0, 0, true));
        assert!(parse_page(b"12\n3\n").is_none());
        assert!(parse_page(b"garbage").is_none());
    }

    #[test]
    fn a_refusal_keeps_the_reason_not_the_command() {
        let e = refused("x/shadow", "cat: /workspace/x/shadow: Permission denied\n");
        assert_eq!(e.to_string(), "x/shadow: Permission denied");
        assert_eq!(refused("a", "").to_string(), "a: the command failed");
    }
}
