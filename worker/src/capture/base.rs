//! Where a run's change is taken from, recorded as soon as its workspace is
//! known, so that the capture at the end (and a takeover's) diffs from it.

use std::path::Path;

use kiln_protocol::Run;
use kiln_store::{Lease, RunBase, StoreError};

use crate::context::WorkerContext;

/// git's empty tree: what a workspace without a repository is diffed from.
pub const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// How the run's workspace came to be.
pub enum Workspace {
    /// Filled now: checked out at this commit, or (`None`) no repository.
    Fresh { commit: Option<String> },
    /// The session's container, as an earlier run (or attempt) left it.
    Continued,
}

/// Records the run's base. A continued workspace diffs from where the
/// session's previous run left it (its captured tree; its own base when
/// its capture failed); a takeover keeps the base its first attempt
/// recorded. A session whose earlier runs recorded nothing gets none: its
/// change is not captured.
pub async fn record(ctx: &WorkerContext, run: &Run, lease: &Lease, workspace: Workspace) -> Result<(), StoreError> {
    let base = match workspace {
        Workspace::Fresh { commit: None } if run.repo.is_some() => {
            tracing::warn!(run_id = %run.id, "the checkout's commit could not be read; this run's change is not captured");
            return Ok(());
        }
        Workspace::Fresh { commit } => {
            let base = commit.clone().unwrap_or_else(|| EMPTY_TREE.to_owned());
            RunBase { base: base.clone(), base_commit: commit.clone(), session_base: base, session_base_commit: commit }
        }
        Workspace::Continued => {
            if ctx.store.run_base(run.id).await?.is_some() {
                return Ok(());
            }
            let Some(previous) = ctx.store.previous_run(run.session_id, run.id).await? else {
                tracing::info!(run_id = %run.id, "the session's earlier runs recorded no base; this run's change is not captured");
                return Ok(());
            };
            RunBase {
                base: previous.tree.unwrap_or(previous.base.base),
                base_commit: previous.base.session_base_commit.clone(),
                session_base: previous.base.session_base,
                session_base_commit: previous.base.session_base_commit,
            }
        }
    };
    ctx.store.save_run_base(lease, run.session_id, &base).await
}

/// The commit a worker-side checkout (ours, made by `git clone`, not yet
/// touched by the sandbox) has checked out, read from its files: HEAD,
/// then the loose or packed ref it names.
pub fn head_commit(repo: &Path) -> Option<String> {
    let git = repo.join(".git");
    let head = std::fs::read_to_string(git.join("HEAD")).ok()?;
    let head = head.trim();
    let id = match head.strip_prefix("ref: ") {
        None => head.to_owned(),
        Some(name) if name.starts_with("refs/") && !name.split('/').any(|p| p == ".." || p.is_empty()) => {
            match std::fs::read_to_string(git.join(name)) {
                Ok(id) => id.trim().to_owned(),
                Err(_) => packed_ref(&git, name)?,
            }
        }
        Some(_) => return None,
    };
    is_object_id(&id).then_some(id)
}

fn packed_ref(git: &Path, name: &str) -> Option<String> {
    let packed = std::fs::read_to_string(git.join("packed-refs")).ok()?;
    packed.lines().find_map(|line| {
        let (id, r) = line.split_once(' ')?;
        (r == name).then(|| id.to_owned())
    })
}

/// A full hex object id (SHA-1 or SHA-256): safe to put in a command line.
/// The toolbox's capture checks its request by the same rule.
pub use kiln_toolbox::change_capture::is_object_id;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_commit_reads_loose_packed_and_detached_heads() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        let id = "0123456789abcdef0123456789abcdef01234567";
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(git.join("packed-refs"), format!("# pack-refs\n{id} refs/heads/main\n")).unwrap();
        assert_eq!(head_commit(dir.path()).as_deref(), Some(id));
        std::fs::write(git.join("refs/heads/main"), format!("{id}\n")).unwrap();
        assert_eq!(head_commit(dir.path()).as_deref(), Some(id));
        std::fs::write(git.join("HEAD"), format!("{id}\n")).unwrap();
        assert_eq!(head_commit(dir.path()).as_deref(), Some(id));
        std::fs::write(git.join("HEAD"), "ref: refs/../../etc/passwd\n").unwrap();
        assert_eq!(head_commit(dir.path()), None);
        std::fs::write(git.join("HEAD"), "$(touch x)\n").unwrap();
        assert_eq!(head_commit(dir.path()), None);
    }
}
