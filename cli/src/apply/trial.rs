//! The dry run of a three-way apply: `git apply --3way` writes conflict
//! markers into the files it cannot merge, and `--check` does not tell a
//! merge that conflicts from one that does not. So the apply is first
//! made in a scratch clone that borrows the checkout's objects (`clone
//! --shared`: the checkout is only read), holding a copy of the
//! checkout's index and of the files the change touches; the checkout
//! itself is written only once that apply went through without conflict.

use std::path::{Component, Path, PathBuf};

use super::ApplyError;
use super::git::{self, GitError};

/// How the dry run went.
pub enum Trial {
    Clean,
    /// The files left unmerged.
    Conflicts(Vec<String>),
    /// git refused the patch outright (its words).
    Refused(String),
}

/// Applies `patch` three-way in a scratch copy of the checkout at `top`
/// (its index and the files at `paths`).
pub fn three_way(top: &Path, paths: &[&str], patch: &[u8]) -> Result<Trial, ApplyError> {
    let scratch = tempfile::tempdir().map_err(|e| ApplyError::Local(format!("a scratch directory: {e}")))?;
    let copy = scratch.path().join("checkout");
    let copy_str = copy.to_string_lossy().into_owned();
    let top_str = top.to_string_lossy().into_owned();
    expect_ok(top, &["clone", "--quiet", "--shared", "--no-checkout", &top_str, &copy_str])?;
    let index = git::answer(top, &["rev-parse", "--path-format=absolute", "--git-path", "index"])?
        .ok_or_else(|| ApplyError::Local("git cannot say where the checkout's index is".into()))?;
    if Path::new(&index).exists() {
        std::fs::copy(&index, copy.join(".git").join("index"))
            .map_err(|e| ApplyError::Local(format!("copying the index: {e}")))?;
    }
    for path in paths {
        copy_entry(top, &copy, path)?;
    }
    // The copied index has the checkout's file stats, which the copies do
    // not share: re-read them, so a copy counts as matching the index
    // exactly when its content does (as in the checkout). Files the change
    // does not touch are not copied; they are missing here, and that is
    // no answer, so the exit status is not one either.
    git::run(&copy, &["update-index", "-q", "--ignore-missing", "--refresh"], None)?;
    let out = git::run(&copy, &["apply", "--3way", "--whitespace=nowarn"], Some(patch))?;
    if out.status.success() {
        return Ok(Trial::Clean);
    }
    let unmerged = git::answer(&copy, &["diff", "--name-only", "--diff-filter=U"])?.unwrap_or_default();
    let unmerged: Vec<String> = unmerged.lines().map(str::to_owned).collect();
    Ok(if unmerged.is_empty() { Trial::Refused(git::said(&out)) } else { Trial::Conflicts(unmerged) })
}

fn expect_ok(dir: &Path, args: &[&str]) -> Result<(), ApplyError> {
    let out = git::run(dir, args, None)?;
    if out.status.success() { Ok(()) } else { Err(ApplyError::Local(format!("git {}: {}", args[0], git::said(&out)))) }
}

/// Copies the checkout's `path` (a file or a symlink, as it is now, mode
/// kept) into the scratch copy; nothing when the checkout has none.
fn copy_entry(top: &Path, copy: &Path, path: &str) -> Result<(), ApplyError> {
    let from = top.join(path);
    let Ok(meta) = std::fs::symlink_metadata(&from) else { return Ok(()) };
    let to = copy.join(path);
    let local = |e: std::io::Error| ApplyError::Local(format!("copying {path} for the dry run: {e}"));
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(local)?;
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&from).map_err(local)?;
        std::os::unix::fs::symlink(target, &to).map_err(local)?;
    } else if meta.is_file() {
        std::fs::copy(&from, &to).map_err(local)?;
    }
    Ok(())
}

/// Whether `path` (from the server, so untrusted) names a file inside the
/// checkout at `top`: relative, no `..`, not in `.git`, and reached through
/// no symlink of the checkout's (which could lead out of it).
pub fn inside(top: &Path, path: &str) -> bool {
    let relative = Path::new(path);
    let plain = relative.components().all(|c| matches!(c, Component::Normal(_)));
    let in_git = relative.components().any(|c| c.as_os_str().eq_ignore_ascii_case(".git"));
    if path.is_empty() || !plain || in_git {
        return false;
    }
    let mut at = PathBuf::from(top);
    let parents: Vec<Component> = relative.components().collect();
    for part in &parents[..parents.len().saturating_sub(1)] {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return false;
        }
    }
    true
}

impl From<GitError> for ApplyError {
    fn from(e: GitError) -> Self {
        ApplyError::Local(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_checkout_are_refused() {
        let top = Path::new("/nonexistent-checkout");
        assert!(inside(top, "src/lib.rs"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", ".git/config", "a/.GIT/hooks/x", "./a"] {
            assert!(!inside(top, bad), "{bad}");
        }
    }
}
