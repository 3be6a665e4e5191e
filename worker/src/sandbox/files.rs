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
    fn a_refusal_keeps_the_reason_not_the_command() {
        let e = refused("x/shadow", "cat: /workspace/x/shadow: Permission denied\n");
        assert_eq!(e.to_string(), "x/shadow: Permission denied");
        assert_eq!(refused("a", "").to_string(), "a: the command failed");
    }
}
