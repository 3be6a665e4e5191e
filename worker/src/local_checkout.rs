//! The run's repository at its base commit, checked out on the worker's
//! side before any sandbox exists: what decides the run's environment
//! (`.kiln/environment.toml`), what a plain sandbox is filled with, what
//! setup starts from and what a cached sandbox is moved to.

use std::path::{Path, PathBuf};

use kiln_protocol::Run;

use crate::context::WorkerContext;
use crate::origin::Origin;
use crate::sandbox::SandboxError;

/// A checkout in a temporary directory, removed when dropped.
pub struct LocalCheckout {
    _dir: tempfile::TempDir,
    path: PathBuf,
    commit: Option<String>,
}

impl LocalCheckout {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The commit checked out: the base of the run's change.
    pub fn commit(&self) -> Option<String> {
        self.commit.clone()
    }
}

/// Clones the run's repository (with the GitHub App's token for a GitHub
/// run); `None`: the run names no repository.
pub async fn make(ctx: &WorkerContext, run: &Run) -> Result<Option<LocalCheckout>, SandboxError> {
    let Some(repo) = &run.repo else { return Ok(None) };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("repo");
    // An attempt starts where its group's first checkout did, however the
    // branch moved since.
    let pinned = match run.group_run_id {
        Some(group) => ctx.store.group_base(group).await.map_err(store_failed)?,
        None => None,
    };
    let git_ref = pinned.as_deref().or(repo.git_ref.as_deref());
    Origin::of(ctx, run).check_out(ctx, run, repo, git_ref, &path).await?;
    let mut commit = crate::capture::base::head_commit(&path);
    if let (Some(group), None, Some(got)) = (run.group_run_id, &pinned, &commit) {
        let base = ctx.store.pin_group_base(group, got).await.map_err(store_failed)?;
        // Another attempt pinned a different commit first: start from it.
        if let Some(base) = base.filter(|b| b != got) {
            let path = dir.path().join("repo-at-base");
            // As the first checkout was made (a GitHub run's with its token,
            // which finds the pinned base itself).
            Origin::of(ctx, run).check_out(ctx, run, repo, Some(base.as_str()), &path).await?;
            commit = crate::capture::base::head_commit(&path);
            return Ok(Some(LocalCheckout { _dir: dir, path, commit }));
        }
    }
    Ok(Some(LocalCheckout { _dir: dir, path, commit }))
}

fn store_failed(e: kiln_store::StoreError) -> SandboxError {
    SandboxError::Workspace(format!("reading the group's base commit: {e}"))
}
