//! A run's change (see `migrations/V22__run_changes.sql`): where it is
//! taken from (`run_change_bases`) and what was captured (`run_changes`).
//!
//! The worker writes both under the run's lease, like every worker write;
//! the API reads them (after checking the run is the caller's). Nothing
//! here runs git: the worker captures inside the sandbox.

use std::collections::HashMap;

use kiln_protocol::changes::{ChangeScope, ChangeTotals, FileChange, RunChanges};
use uuid::Uuid;

use crate::lease::Lease;
use crate::{Store, StoreError};

/// Where a run's change is taken from, inside its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunBase {
    /// What the run's own change is diffed from: the checked-out commit, the
    /// tree the session's previous run left, or the empty tree.
    pub base: String,
    /// The repository commit under the run's change (`None`: no repository).
    /// For a follow-up it is the session's commit: the run's patch applies
    /// on top of the previous runs' patches.
    pub base_commit: Option<String>,
    /// What the session's cumulative change is diffed from.
    pub session_base: String,
    pub session_base_commit: Option<String>,
}

/// The session's previous run, as a follow-up continues from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousRun {
    pub run_id: Uuid,
    pub base: RunBase,
    /// The tree its capture left the workspace at; `None` when its capture
    /// failed or never happened.
    pub tree: Option<String>,
}

/// One captured change, as the worker stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedChange {
    pub scope: ChangeScope,
    pub base_commit: Option<String>,
    /// The tree the workspace was captured at (in the sandbox).
    pub tree: Option<String>,
    pub files: Vec<FileChange>,
    pub totals: ChangeTotals,
    /// `None` exactly when `too_large`.
    pub patch: Option<Vec<u8>>,
    pub patch_bytes: u64,
    pub too_large: bool,
}

/// A run's stored patch, as `GET /v1/runs/{id}/patch` serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchRow {
    pub base_commit: Option<String>,
    /// `None` when the patch was too large to keep.
    pub patch: Option<Vec<u8>>,
    pub patch_bytes: u64,
    pub too_large: bool,
}

/// Holds only while `$2..$4` are still the run's lease and the run has not
/// ended: a worker that lost the run stores nothing.
const FENCE: &str = "EXISTS (SELECT 1 FROM runs WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                            AND status IN ('running', 'awaiting_approval'))";

fn scope_str(scope: ChangeScope) -> &'static str {
    match scope {
        ChangeScope::Run => "run",
        ChangeScope::Session => "session",
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn uncount(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Store {
    /// Records where the run's change is taken from (replacing an earlier
    /// attempt's: a takeover with a fresh workspace starts again).
    pub async fn save_run_base(&self, lease: &Lease, session_id: Uuid, base: &RunBase) -> Result<(), StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "INSERT INTO run_change_bases (run_id, session_id, base, base_commit, session_base, session_base_commit)
                     SELECT $1, $4, $5, $6, $7, $8 WHERE {FENCE}
                     ON CONFLICT (run_id) DO UPDATE SET base = $5, base_commit = $6, session_base = $7,
                         session_base_commit = $8, recorded_at = now()"
                ),
                &[
                    &lease.run_id,
                    &lease.attempt,
                    &lease.worker,
                    &session_id,
                    &base.base,
                    &base.base_commit,
                    &base.session_base,
                    &base.session_base_commit,
                ],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::LeaseLost(lease.run_id));
        }
        Ok(())
    }

    /// Where the run's change is taken from, if recorded.
    pub async fn run_base(&self, run_id: Uuid) -> Result<Option<RunBase>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT base, base_commit, session_base, session_base_commit FROM run_change_bases WHERE run_id = $1",
                &[&run_id],
            )
            .await?;
        row.map(|r| base_from_row(&r, 0)).transpose()
    }

    /// The latest other run of the session whose base was recorded, with
    /// the tree its capture left: where a follow-up continues from.
    pub async fn previous_run(&self, session_id: Uuid, run_id: Uuid) -> Result<Option<PreviousRun>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT b.run_id, b.base, b.base_commit, b.session_base, b.session_base_commit,
                        (SELECT c.tree FROM run_changes c WHERE c.run_id = b.run_id AND c.scope = 'run')
                 FROM run_change_bases b
                 WHERE b.session_id = $1 AND b.run_id <> $2
                 ORDER BY b.recorded_at DESC LIMIT 1",
                &[&session_id, &run_id],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(PreviousRun { run_id: row.try_get(0)?, base: base_from_row(&row, 1)?, tree: row.try_get(5)? }))
    }

    /// Stores one captured change of the run (replacing an earlier
    /// attempt's), fenced by the run's lease.
    pub async fn save_run_changes(&self, lease: &Lease, change: &CapturedChange) -> Result<(), StoreError> {
        let files = serde_json::to_value(&change.files).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "INSERT INTO run_changes (run_id, scope, base_commit, tree, files, file_count, additions, deletions,
                                              patch, patch_bytes, too_large)
                     SELECT $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 WHERE {FENCE}
                     ON CONFLICT (run_id, scope) DO UPDATE SET base_commit = $5, tree = $6, files = $7,
                         file_count = $8, additions = $9, deletions = $10, patch = $11, patch_bytes = $12,
                         too_large = $13, captured_at = now()"
                ),
                &[
                    &lease.run_id,
                    &lease.attempt,
                    &lease.worker,
                    &scope_str(change.scope),
                    &change.base_commit,
                    &change.tree,
                    &files,
                    &count(change.totals.files),
                    &count(change.totals.additions),
                    &count(change.totals.deletions),
                    &change.patch,
                    &count(change.patch_bytes),
                    &change.too_large,
                ],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::LeaseLost(lease.run_id));
        }
        Ok(())
    }

    /// The run's captured change, summarised (no patch bytes read). Not
    /// scoped to an owner: check the run is the caller's first.
    pub async fn run_changes(&self, run_id: Uuid, scope: ChangeScope) -> Result<Option<RunChanges>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT base_commit, files, file_count, additions, deletions, patch_bytes, too_large
                 FROM run_changes WHERE run_id = $1 AND scope = $2",
                &[&run_id, &scope_str(scope)],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let files: serde_json::Value = row.try_get(1)?;
        let files: Vec<FileChange> =
            serde_json::from_value(files).map_err(|e| StoreError::Corrupt(format!("run_changes.files: {e}")))?;
        Ok(Some(RunChanges {
            run_id,
            scope,
            base_commit: row.try_get(0)?,
            files,
            totals: ChangeTotals {
                files: uncount(row.try_get(2)?),
                additions: uncount(row.try_get(3)?),
                deletions: uncount(row.try_get(4)?),
            },
            patch_bytes: uncount(row.try_get(5)?),
            too_large: row.try_get(6)?,
        }))
    }

    /// The run's stored patch. Not scoped to an owner: check the run is the
    /// caller's first.
    pub async fn run_patch(&self, run_id: Uuid, scope: ChangeScope) -> Result<Option<PatchRow>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT base_commit, patch, patch_bytes, too_large FROM run_changes WHERE run_id = $1 AND scope = $2",
                &[&run_id, &scope_str(scope)],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(PatchRow {
            base_commit: row.try_get(0)?,
            patch: row.try_get(1)?,
            patch_bytes: uncount(row.try_get(2)?),
            too_large: row.try_get(3)?,
        }))
    }

    /// The totals of the runs' own changes (scope `run`), for the run
    /// objects a listing returns; runs without a captured change are absent.
    pub async fn change_totals(&self, run_ids: &[Uuid]) -> Result<HashMap<Uuid, ChangeTotals>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT run_id, file_count, additions, deletions FROM run_changes
                 WHERE run_id = ANY($1) AND scope = 'run'",
                &[&run_ids],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let totals = ChangeTotals {
                    files: uncount(row.try_get(1)?),
                    additions: uncount(row.try_get(2)?),
                    deletions: uncount(row.try_get(3)?),
                };
                Ok((row.try_get(0)?, totals))
            })
            .collect()
    }
}

fn base_from_row(row: &tokio_postgres::Row, from: usize) -> Result<RunBase, StoreError> {
    Ok(RunBase {
        base: row.try_get(from)?,
        base_commit: row.try_get(from + 1)?,
        session_base: row.try_get(from + 2)?,
        session_base_commit: row.try_get(from + 3)?,
    })
}
