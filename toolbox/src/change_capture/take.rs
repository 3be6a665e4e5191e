//! git's work: `add -A`, then, side by side, `write-tree` (the tree is the
//! session's next base), one diff per scope into a file of its own, and,
//! for a seed nobody vouched for, the check of the index's flags.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Stdio};

use super::git::{Git, NO_GIT, spawn};
use super::is_object_id;
use super::seed::sha256_of;
use super::{ADD_FAILED, DIFF_FAILED, Failed, NO_TREE, Request};

/// What git gave.
#[derive(Debug)]
pub struct Taken {
    /// The tree the workspace was captured at.
    pub tree: String,
    /// The SHA-256 of the index as left, for the worker to vouch for.
    pub index_hash: Option<String>,
    /// An entry of the seed was marked assume-unchanged or skip-worktree:
    /// what was taken may miss a change.
    pub flagged: bool,
}

/// The file each scope's diff is written to.
pub fn diff_file(out: &Path, scope: &str) -> std::path::PathBuf {
    out.join(format!("{scope}.diff"))
}

/// Stages the workspace onto the index and takes the diffs; with `check`,
/// also whether the seed had flagged entries.
pub fn take(git: &Git, request: &Request, out: &Path, check: bool) -> Result<Taken, Failed> {
    if !git.succeeds(&mut git.command(["add", "-A"]))? {
        return Err(Failed::new(ADD_FAILED, "git add -A failed".into()));
    }
    let mut diffs = vec![diff_into(git, &request.base, &diff_file(out, "run"))?];
    if request.session_base != request.base {
        diffs.push(diff_into(git, &request.session_base, &diff_file(out, "session"))?);
    }
    let write_tree = spawn(git.command(["write-tree"]).stdout(Stdio::piped()))?;
    let flags = match check {
        true => Some(spawn(git.command(["ls-files", "-v", "-z"]).stdout(Stdio::piped()))?),
        false => None,
    };
    let tree = read_tree(write_tree);
    // Hashed once write-tree has rewritten it (with its cache of trees).
    let index_hash = sha256_of(git.index());
    let flagged = flags.map(any_flagged).unwrap_or(false);
    for diff in diffs {
        if !wait(diff)? {
            return Err(Failed::new(DIFF_FAILED, "git diff failed".into()));
        }
    }
    let tree = tree?;
    Ok(Taken { tree, index_hash, flagged })
}

/// One scope's diff from `from`, written to `file`.
fn diff_into(git: &Git, from: &str, file: &Path) -> Result<Child, Failed> {
    let output = super::create(file).map_err(Failed::io(DIFF_FAILED, "writing the diff"))?;
    spawn(git.diff(from, "--binary").stdout(output))
}

/// The tree `write-tree` printed.
fn read_tree(mut child: Child) -> Result<String, Failed> {
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout.take(128).read_to_string(&mut text);
    }
    let tree = text.trim_end().to_owned();
    match wait(child)? && is_object_id(&tree) {
        true => Ok(tree),
        false => Err(Failed::new(NO_TREE, "git write-tree failed".into())),
    }
}

/// Whether `ls-files -v` tagged any entry other than `H ` (tracked, no
/// flag); a listing that fails counts as flagged (the capture is then taken
/// from the empty index, which is always right).
fn any_flagged(mut child: Child) -> bool {
    let flagged = child.stdout.take().is_some_and(|stdout| {
        BufReader::with_capacity(1 << 16, stdout)
            .split(0)
            .any(|entry| !matches!(entry, Ok(entry) if entry.is_empty() || entry.starts_with(b"H ")))
    });
    if flagged {
        // The rest of the listing is not needed.
        let _ = child.kill();
        let _ = child.wait();
        return true;
    }
    !matches!(wait(child), Ok(true))
}

fn wait(mut child: Child) -> Result<bool, Failed> {
    Ok(child.wait().map_err(|e| Failed::new(NO_GIT, format!("waiting for git: {e}")))?.success())
}
