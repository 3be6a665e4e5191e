//! Where a run came from, and the one thing that decides of its life before
//! the sandbox: how its repository is checked out. An API run (REST, the
//! CLI, the web view) is cloned as its spec says; a run a GitHub webhook
//! started is checked out with the GitHub App's token, after its sender is
//! admitted and its trigger acknowledged. A later origin (GitLab, …) is one
//! more variant here. What happens after the run's end by origin is in
//! `crate::delivery`.

use std::path::Path;

use kiln_protocol::{RepoSpec, Run, Trigger};

use crate::context::WorkerContext;
use crate::github::Github;
use crate::sandbox::SandboxError;
use crate::sandbox::repo_clone;

/// A run's origin, as this worker can serve it.
pub enum Origin<'a> {
    /// Submitted over the API, or a GitHub run on a worker without GitHub
    /// configured (cloned as any run is).
    Api,
    /// Started by a GitHub webhook, on a worker with the GitHub App.
    Github(&'a Github),
}

impl<'a> Origin<'a> {
    /// `run`'s origin on this worker.
    pub fn of(ctx: &'a WorkerContext, run: &Run) -> Self {
        match ctx.config.github.as_ref() {
            Some(github) if run.trigger == Trigger::Github => Origin::Github(github),
            _ => Origin::Api,
        }
    }

    /// Checks `repo` out into `dest` at `git_ref` (the spec's, or the
    /// commit a group of attempts is pinned to).
    pub async fn check_out(
        &self,
        ctx: &WorkerContext,
        run: &Run,
        repo: &RepoSpec,
        git_ref: Option<&str>,
        dest: &Path,
    ) -> Result<(), SandboxError> {
        if let Origin::Github(github) = self
            && let Some(done) = crate::github::checkout(github, ctx, run, dest).await
        {
            return done;
        }
        repo_clone::clone_repo(&repo.url, git_ref, dest, &ctx.config.clone_settings()).await
    }
}
