//! A run's change: what the run did to its workspace, from its base.
//!
//! The worker captures it inside the sandbox when the run ends (whatever
//! the end), the store keeps it with the run, and the API serves it as a
//! patch (`GET /v1/runs/{id}/patch`, `text/x-diff`, what `git apply`
//! takes) and as this summary (`GET /v1/runs/{id}/changes`). The CLI's
//! `kiln diff` / `kiln apply` and the web view's diff panel read these.

use serde::{Deserialize, Serialize};

/// What happened to one file, as `git diff --name-status` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileStatus {
    Added,
    Modified,
    Deleted,
    Renamed,
    Copied,
    /// A file became a symlink or the other way round.
    TypeChanged,
}

/// One changed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileChange {
    /// The path after the change (for a deleted file, the path it had).
    pub path: String,
    /// The path before, for a renamed or copied file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    pub status: FileStatus,
    /// Lines added and removed (0 for a binary file).
    pub additions: u64,
    pub deletions: u64,
    /// Whether git treats the file as binary (the patch has it as a
    /// `GIT binary patch`; no lines are counted).
    pub binary: bool,
}

/// The sums over a change's files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChangeTotals {
    pub files: u64,
    pub additions: u64,
    pub deletions: u64,
}

/// Which change of a run: its own (from where the run started), or its
/// session's (from the session's first base to where this run left it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeScope {
    #[default]
    Run,
    Session,
}

/// `GET /v1/runs/{id}/changes`: a run's change, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunChanges {
    pub run_id: uuid::Uuid,
    pub scope: ChangeScope,
    /// The commit the change is taken against; `None` for a run without a
    /// repository (its workspace's files are all new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    pub files: Vec<FileChange>,
    pub totals: ChangeTotals,
    /// The patch's size in bytes.
    pub patch_bytes: u64,
    /// The patch was larger than the deployment keeps (`KILN_MAX_PATCH_MB`):
    /// the summary is here, the patch is not (`/patch` answers 409).
    pub too_large: bool,
}
