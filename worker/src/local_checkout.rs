//! The run's repository at its base commit, checked out on the worker's
//! side before any sandbox exists: what decides the run's environment
//! (`.kiln/environment.toml`), what a plain sandbox is filled with, what
//! setup starts from and what a cached sandbox is moved to.

use std::path::{Path, PathBuf};

use kiln_protocol::Run;

use crate::context::WorkerContext;
use crate::sandbox::SandboxError;
use crate::sandbox::repo_clone;

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
    match crate::github::checkout(ctx, run, &path).await {
        Some(done) => done?,
        None => {
            let settings = ctx.config.clone_settings();
            repo_clone::clone_repo(&repo.url, repo.git_ref.as_deref(), &path, &settings).await?;
        }
    }
    let commit = crate::capture::base::head_commit(&path);
    Ok(Some(LocalCheckout { _dir: dir, path, commit }))
}
