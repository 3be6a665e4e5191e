//! Row → protocol type conversions, in one place so every query selects the
//! same columns.

use kiln_protocol::{Limits, ModelSpec, Policy, RepoSpec, Run, RunStatus, Trigger};
use tokio_postgres::Row;

use crate::StoreError;

/// An attempt's group and number; a group's choice and its attempts (only
/// a group looks its attempts up).
macro_rules! attempt_columns {
    () => {
        "r.group_run_id, r.attempt_number, r.selected_attempt, \
         CASE WHEN r.attempt_count IS NOT NULL THEN \
         (SELECT array_agg(a.id ORDER BY a.attempt_number) FROM runs a WHERE a.group_run_id = r.id) END"
    };
}

/// Columns of `runs` (joined with `sessions` as `s`) that [`run_from_row`]
/// reads, in order. Queries use `r` as the alias of `runs`.
pub(crate) const RUN_COLUMNS: &str = concat!(
    "r.id, r.session_id, r.status, r.prompt, s.repo_url, s.repo_ref, \
     r.model, r.limits, r.trigger, r.attempt, r.cancel_requested, r.created_at, r.started_at, \
     r.finished_at, r.result, r.error, r.last_event_seq, r.policy, r.callback_url, r.parent_run_id, r.agent_path, ",
    attempt_columns!()
);

/// The same columns for a `RETURNING` clause, where `sessions` cannot be
/// joined: the repo comes from a sub-select.
pub(crate) const RUN_RETURNING: &str = concat!(
    "r.id, r.session_id, r.status, r.prompt, \
     (SELECT repo_url FROM sessions s WHERE s.id = r.session_id), \
     (SELECT repo_ref FROM sessions s WHERE s.id = r.session_id), \
     r.model, r.limits, r.trigger, r.attempt, r.cancel_requested, r.created_at, r.started_at, \
     r.finished_at, r.result, r.error, r.last_event_seq, r.policy, r.callback_url, r.parent_run_id, r.agent_path, ",
    attempt_columns!()
);

pub(crate) fn run_from_row(row: &Row) -> Result<Run, StoreError> {
    let status: String = row.try_get(2)?;
    let repo_url: Option<String> = row.try_get(4)?;
    let repo_ref: Option<String> = row.try_get(5)?;
    let model: serde_json::Value = row.try_get(6)?;
    let limits: serde_json::Value = row.try_get(7)?;
    let trigger: String = row.try_get(8)?;
    let policy: serde_json::Value = row.try_get(17)?;
    let policy: Policy =
        serde_json::from_value(policy).map_err(|e| StoreError::Corrupt(format!("runs.policy: {e}")))?;
    Ok(Run {
        id: row.try_get(0)?,
        session_id: row.try_get(1)?,
        status: status.parse::<RunStatus>().map_err(|e| StoreError::Corrupt(e.to_string()))?,
        prompt: row.try_get(3)?,
        repo: repo_url.map(|url| RepoSpec { url, git_ref: repo_ref }),
        model: serde_json::from_value::<ModelSpec>(model)
            .map_err(|e| StoreError::Corrupt(format!("runs.model: {e}")))?,
        limits: serde_json::from_value::<Limits>(limits)
            .map_err(|e| StoreError::Corrupt(format!("runs.limits: {e}")))?,
        approval: policy.approval,
        allowed_tools: policy.allowed_tools,
        mcp: policy.mcp,
        agents: policy.agents,
        sandbox: policy.sandbox,
        environment: policy.environment,
        deliver: policy.deliver,
        trigger: match trigger.as_str() {
            "github" => Trigger::Github,
            _ => Trigger::Api,
        },
        attempt: row.try_get(9)?,
        cancel_requested: row.try_get(10)?,
        created_at: row.try_get(11)?,
        started_at: row.try_get(12)?,
        finished_at: row.try_get(13)?,
        result: row.try_get(14)?,
        error: row.try_get(15)?,
        last_event_seq: row.try_get(16)?,
        callback_url: row.try_get(18)?,
        parent_run_id: row.try_get(19)?,
        agent_path: row.try_get(20)?,
        // The API adds it (`Store::change_totals`): most reads need no join.
        changes: None,
        group_run_id: row.try_get(21)?,
        attempt_number: row.try_get::<_, Option<i32>>(22)?.map(|n| n.max(0) as u32),
        selected_attempt: row.try_get::<_, Option<i32>>(23)?.map(|n| n.max(0) as u32),
        attempts: row.try_get(24)?,
        group_limits: policy.group_limits,
    })
}
