//! Run events: what SSE serves and Postgres keeps.
//!
//! An event is stored as `(kind, payload)`; `kind` is the SSE `event:` field
//! and `payload` the `data:` JSON. [`EventBody`] is adjacently tagged so that
//! the split is a plain serde conversion, not hand-written glue.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Usage;
use crate::run::RunStatus;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", content = "payload")]
pub enum EventBody {
    #[serde(rename = "run.queued")]
    RunQueued { prompt: String },
    #[serde(rename = "run.started")]
    RunStarted { worker: String, attempt: i32 },
    /// `origin`: `reused` (the session's own container, workspace as the
    /// last run left it), `warm` (from the warm pool) or `new`.
    /// `workspace_lost`: the conversation continues in a sandbox that is not
    /// the one it happened in (its container was gone), so earlier file
    /// changes are not there.
    /// `disk`: what bounds the sandbox's disk on this worker's engine
    /// (`KILN_SANDBOX_DISK_MODE` as its probe chose it): `layer` (the
    /// writable layer sized by the engine), `loop` (a disk image per
    /// sandbox), `tmpfs` (the workspace in RAM) or `unbounded`.
    #[serde(rename = "sandbox.ready")]
    SandboxReady {
        container: String,
        image: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<String>,
        #[serde(default)]
        workspace_lost: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk: Option<String>,
    },
    /// The run's environment is being prepared: `hit` says whether a
    /// prepared sandbox with this `cache_key` was found (then setup does
    /// not run; the maintenance script does, if there is one).
    #[serde(rename = "environment.started")]
    EnvironmentStarted { environment: String, cache_key: String, hit: bool, image: String },
    /// Output of the environment's `setup` or `maintenance` script, in
    /// pieces; bounded per run (the rest is summarised in the finish).
    #[serde(rename = "environment.output")]
    EnvironmentOutput { phase: String, text: String },
    /// A script of the environment ended: `exit_code` 0 on success (a
    /// failure then ends the run with `run.failed`); `stored` says whether
    /// setup's result was kept in the cache as a prepared sandbox (so the
    /// next run hits; whether this one hit is `environment.started.hit`).
    #[serde(rename = "environment.finished")]
    EnvironmentFinished {
        phase: String,
        exit_code: i64,
        duration_ms: u64,
        /// Setup's result was kept in the cache. Absent from events written
        /// before this field existed (read `cached` there).
        #[serde(default)]
        stored: bool,
        /// Deprecated: the same as `stored`, under its old, misleading name
        /// (it never meant "this run hit the cache"); still written for one
        /// release so existing clients keep working, then removed.
        #[schema(deprecated)]
        cached: bool,
    },
    /// The agent's plan (the `todo` tool), the whole list each time.
    #[serde(rename = "todo")]
    Todo { items: Vec<TodoItem> },
    /// The older part of the conversation was summarised to fit the
    /// context window: `summarized_messages` now stand behind a summary,
    /// the last `kept_messages` stay verbatim. `input_tokens`: the step
    /// input that called for it; `usage`/`cost_usd`: the summarising call.
    #[serde(rename = "compaction")]
    Compaction {
        summarized_messages: u32,
        kept_messages: u32,
        input_tokens: u64,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
    #[serde(rename = "step.started")]
    StepStarted { step: u32 },
    #[serde(rename = "text.delta")]
    TextDelta { text: String },
    #[serde(rename = "reasoning.delta")]
    ReasoningDelta { text: String },
    /// `call_id` in this and the other events of a call is Kiln's id for
    /// it, `{step}-{n}`, unique within the run (not the provider's, which
    /// servers reuse); its approval is decided under the same id.
    #[serde(rename = "tool_call.started")]
    ToolCallStarted { call_id: String, name: String },
    #[serde(rename = "tool_call.delta")]
    ToolCallDelta { call_id: String, arguments_delta: String },
    #[serde(rename = "tool_call.ready")]
    ToolCallReady { call_id: String, name: String, arguments: Value },
    #[serde(rename = "tool.output")]
    ToolOutput { call_id: String, text: String },
    #[serde(rename = "tool.result")]
    ToolResult { call_id: String, name: String, output: String, is_error: bool, duration_ms: u64 },
    #[serde(rename = "step.finished")]
    StepFinished {
        step: u32,
        finish_reason: String,
        usage: Usage,
        /// `None` when the model has no price in the worker's price table.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
    /// A tool call waits for a person (`POST /v1/runs/{id}/approvals/{call_id}`).
    /// For a tool of an MCP server, `mcp_server` names the server and
    /// `mcp_tool` the tool as that server calls it (`name` is the model's
    /// name for it, `mcp__<server>__<tool>`, sanitised and maybe cut);
    /// absent for built-in tools.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        call_id: String,
        name: String,
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp_server: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp_tool: Option<String>,
    },
    #[serde(rename = "approval.resolved")]
    ApprovalResolved {
        call_id: String,
        approved: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A client's message will join the conversation before the next model call.
    #[serde(rename = "message.queued")]
    MessageQueued { text: String },
    #[serde(rename = "model.retry")]
    ModelRetry { attempt: u32, delay_ms: u64, error: String },
    /// The egress proxy refused a connection or request from the run's
    /// sandbox. `rule`: what refused it (`layer` says whose policy:
    /// `deployment`, `run` (the agent phase's), `setup` (an environment's
    /// setup phase's), or `proxy` for the proxy's own checks: addresses,
    /// SNI, malformed requests). `suppressed`: refusals since the
    /// previous event that were not written (the run's stream is bounded).
    #[serde(rename = "network.denied")]
    NetworkDenied {
        host: String,
        port: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        layer: String,
        rule: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        suppressed: u64,
    },
    /// The egress proxy let the sandbox reach `host:port`: written the
    /// first time per host and port in a run, for a bounded number of them
    /// (`/metrics` counts every connection).
    #[serde(rename = "network.allowed")]
    NetworkAllowed { host: String, port: u16 },
    /// A `task` call started a sub-agent: its own run (`run_id`, with its
    /// own stream), in the same session and sandbox. `agent_path` says
    /// where it sits, e.g. `main/explore[1-1]`; `call_id` is the parent's
    /// call. `taken_over`: a child an earlier attempt started, continued.
    #[serde(rename = "subagent.started")]
    SubagentStarted {
        call_id: String,
        run_id: uuid::Uuid,
        agent_path: String,
        agent: String,
        description: String,
        #[serde(default)]
        taken_over: bool,
    },
    /// One of a sub-agent's events, copied into its parent's stream as it
    /// happens: only step- and tool-level kinds (`step.started`,
    /// `step.finished`, `tool_call.ready`, `tool.result` with its output
    /// cut to 2000 characters, `todo`, `approval.requested`), never
    /// streamed text or output, so a busy child cannot flood its parent's
    /// stream. `seq` is the event's seq in the child's own stream.
    #[serde(rename = "subagent.event")]
    SubagentEvent { call_id: String, run_id: uuid::Uuid, agent_path: String, seq: i64, event: Value },
    /// A sub-agent ended. `status` is its run's; `summary` its final answer
    /// (what the parent's call returns) or why it did not succeed;
    /// `usage`, `cost_usd` and `steps` what it spent, counted in the
    /// parent's totals and budget.
    #[serde(rename = "subagent.finished")]
    SubagentFinished {
        call_id: String,
        run_id: uuid::Uuid,
        agent_path: String,
        status: String,
        summary: String,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        steps: u32,
    },
    /// In a group's stream: one of an attempt's events, copied as it
    /// happens (the step- and tool-level kinds a sub-agent's are, and the
    /// attempt's `sandbox.ready` and `changes.captured`), never streamed
    /// text or output. `attempt` is which attempt (1 for the first),
    /// `run_id` its run, `seq` the event's seq in the attempt's own stream.
    #[serde(rename = "attempt.event")]
    AttemptEvent { attempt: u32, run_id: uuid::Uuid, seq: i64, event: Value },
    /// In a group's stream: an attempt ended. `status` is its run's;
    /// `summary` its final answer or why it did not succeed; `usage`,
    /// `cost_usd` and `steps` what it spent (the group's totals are their
    /// sum); `changes` what it changed, if its change was captured.
    #[serde(rename = "attempt.finished")]
    AttemptFinished {
        attempt: u32,
        run_id: uuid::Uuid,
        status: String,
        summary: String,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        steps: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        changes: Option<crate::changes::ChangeTotals>,
    },
    /// In a group's stream: attempt `attempt` (run `run_id`) was chosen as
    /// the group's result; the group's patch is its change from now on.
    #[serde(rename = "attempt.selected")]
    AttemptSelected { attempt: u32, run_id: uuid::Uuid },
    /// The run's change was captured from its workspace (right before the
    /// terminal event; `GET /v1/runs/{id}/patch` serves it). `too_large`:
    /// the patch was over `KILN_MAX_PATCH_MB` and only its summary was kept.
    #[serde(rename = "changes.captured")]
    ChangesCaptured { files: u64, additions: u64, deletions: u64, too_large: bool },
    #[serde(rename = "run.succeeded")]
    RunSucceeded { summary: String },
    #[serde(rename = "run.failed")]
    RunFailed { error: String },
    #[serde(rename = "run.cancelled")]
    RunCancelled { reason: String },
    #[serde(rename = "run.timed_out")]
    RunTimedOut { limit_s: u32 },
    /// A GitHub-triggered run's result was reported on GitHub. Comes after
    /// the terminal event.
    #[serde(rename = "delivery.succeeded")]
    DeliverySucceeded {
        /// The pull request opened, if the run changed files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pull_request: Option<String>,
        /// The issue comment posted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        comment: Option<String>,
        /// `deliver.git`: the branch pushed, its commit and the remote.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        commit: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remote: Option<String>,
    },
    /// Reporting the result on GitHub failed; the run's own result stands.
    /// `POST /v1/runs/{id}/deliver` tries again.
    #[serde(rename = "delivery.failed")]
    DeliveryFailed { error: String },
    /// An attempt at pushing the run's change (`deliver.git`) failed for a
    /// reason that may pass (the remote down or answering 5xx, a network
    /// error); another attempt is due in `retry_in_ms`, on any worker.
    /// Attempts that run out end with `delivery.failed`.
    #[serde(rename = "delivery.retrying")]
    DeliveryRetrying {
        /// 1 for the first try.
        attempt: u32,
        error: String,
        retry_in_ms: u64,
    },
    /// The run's completion callback (`callback_url`) was answered with a
    /// 2xx. Comes after the terminal event.
    #[serde(rename = "callback.succeeded")]
    CallbackSucceeded {
        /// 1 for the first try.
        attempt: u32,
        /// The receiver's HTTP status.
        status: u16,
        /// The `X-Kiln-Delivery` id, the same on every attempt.
        delivery_id: String,
    },
    /// One attempt at the completion callback failed: no request was made
    /// (the target is not allowed), it went unanswered, or the answer was
    /// not a 2xx. `retry_in_ms` says when the next attempt is due; absent,
    /// Kiln has given up on this callback.
    #[serde(rename = "callback.failed")]
    CallbackFailed {
        attempt: u32,
        /// The receiver's HTTP status, if it answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        error: String,
        delivery_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_in_ms: Option<u64>,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Kinds after which a run's stream ends.
pub const TERMINAL_KINDS: [&str; 4] = ["run.succeeded", "run.failed", "run.cancelled", "run.timed_out"];

pub fn is_terminal_kind(kind: &str) -> bool {
    TERMINAL_KINDS.contains(&kind)
}

#[derive(Debug, thiserror::Error)]
#[error("event body did not serialize as {{kind, payload}}")]
pub struct EventShapeError;

impl EventBody {
    /// `environment.finished`, with `stored` under its old name `cached`
    /// too, for clients of the last release.
    pub fn environment_finished(phase: String, exit_code: i64, duration_ms: u64, stored: bool) -> Self {
        EventBody::EnvironmentFinished { phase, exit_code, duration_ms, stored, cached: stored }
    }

    /// Splits into the `(kind, payload)` pair stored in the events table.
    pub fn into_parts(self) -> Result<(String, Value), EventShapeError> {
        let value = serde_json::to_value(self).map_err(|_| EventShapeError)?;
        let Value::Object(mut map) = value else {
            return Err(EventShapeError);
        };
        let kind = match map.remove("kind") {
            Some(Value::String(k)) => k,
            _ => return Err(EventShapeError),
        };
        let payload = map.remove("payload").unwrap_or(Value::Object(Default::default()));
        Ok((kind, payload))
    }

    pub fn is_terminal(&self) -> bool {
        self.terminal_status().is_some()
    }

    /// The status a run ends in with this event; `None` for an event that
    /// does not end a run.
    pub fn terminal_status(&self) -> Option<RunStatus> {
        match self {
            EventBody::RunSucceeded { .. } => Some(RunStatus::Succeeded),
            EventBody::RunFailed { .. } => Some(RunStatus::Failed),
            EventBody::RunCancelled { .. } => Some(RunStatus::Cancelled),
            EventBody::RunTimedOut { .. } => Some(RunStatus::TimedOut),
            _ => None,
        }
    }
}

/// An event as stored and served. The payload stays raw JSON so an API
/// instance can serve kinds newer than itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub seq: i64,
    pub kind: String,
    pub payload: Value,
    pub at: DateTime<Utc>,
}

impl StoredEvent {
    /// Parses the payload back into a typed body (unknown kinds give `None`).
    pub fn body(&self) -> Option<EventBody> {
        let v = serde_json::json!({ "kind": self.kind, "payload": self.payload });
        serde_json::from_value(v).ok()
    }
}

/// Alias used by clients reading events.
pub type EventRecord = StoredEvent;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_splits_into_kind_and_payload_and_back() {
        let body = EventBody::ToolResult {
            call_id: "c1".into(),
            name: "bash".into(),
            output: "hello\n".into(),
            is_error: false,
            duration_ms: 3,
        };
        let (kind, payload) = body.clone().into_parts().unwrap();
        assert_eq!(kind, "tool.result");
        assert_eq!(payload["output"], "hello\n");
        let stored = StoredEvent { seq: 1, kind, payload, at: Utc::now() };
        assert_eq!(stored.body(), Some(body));
    }

    #[test]
    fn terminal_kinds_agree_with_bodies() {
        for body in [
            EventBody::RunSucceeded { summary: String::new() },
            EventBody::RunFailed { error: String::new() },
            EventBody::RunCancelled { reason: String::new() },
            EventBody::RunTimedOut { limit_s: 1 },
        ] {
            assert!(body.is_terminal());
            let status = body.terminal_status().unwrap();
            assert!(status.is_terminal());
            let (kind, _) = body.into_parts().unwrap();
            assert!(is_terminal_kind(&kind));
            // `run.timed_out` ends a run `timed_out`, and so on.
            assert_eq!(kind.strip_prefix("run."), Some(status.as_str()));
        }
        assert!(!is_terminal_kind("text.delta"));
        assert_eq!(EventBody::StepStarted { step: 1 }.terminal_status(), None);
    }
}

/// One item of the agent's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TodoItem {
    pub text: String,
    pub status: TodoStatus,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    #[default]
    Pending,
    InProgress,
    #[serde(alias = "completed")]
    Done,
}
