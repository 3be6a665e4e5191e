//! Running one child: start (or take over) its row, drive its loop in this
//! task with the parent's sandbox, end it, and tell the parent.
//!
//! Why in the parent's task and not claimed as a run of its own: the child
//! works in the parent's sandbox, a container on this worker's Docker
//! engine, which another worker may not reach; and the parent waits for
//! the answer anyway. The child still has its own lease, heartbeat and
//! stream, so clients see it as a run, a client can cancel it alone, and a
//! lost worker leaves it to be taken over with its parent: the parent's
//! next attempt re-runs the unanswered `task` call (see `agent::resume`),
//! which finds the child's row and continues it from its messages.

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{EventBody, Policy, Run, RunStatus};
use kiln_store::{ChildStart, Lease, NewChild, StoreError};
use tokio_util::sync::CancellationToken;

use super::forward::ParentStream;
use super::kinds::{self, AgentKind};
use super::{Seat, Spend, StepHost};
use crate::agent::control::Control;
use crate::agent::{AgentError, AgentRun, Outcome};
use crate::context::WorkerContext;
use crate::db_retry::with_retry;
use crate::event_sink::EventSink;
use crate::event_sink::budget::EventBudget;
use crate::run_heartbeat::RunHeartbeat;
use crate::tools::ToolOutcome;
use crate::tools::task::TaskArgs;

/// Longest a child's final answer returned to the parent, in characters.
const MAX_ANSWER_CHARS: usize = 30_000;

pub(super) async fn run(host: &StepHost<'_>, call_id: &str, args: TaskArgs) -> ToolOutcome {
    let (kind, limits) = match admit(host, &args) {
        Ok(admitted) => admitted,
        Err(why) => return ToolOutcome::error(why),
    };
    // Waits for a slot: at most `max_parallel` children of the tree at once.
    let Ok(_slot) = host.seat.slots.clone().acquire_owned().await else {
        return ToolOutcome::error("sub-agents are shutting down");
    };
    let ctx = &host.seat.ctx;
    let path = format!("{}/{}[{call_id}]", host.seat.path, kind.name);
    let new = new_child(host, kind, call_id, &path, &args, limits);
    let (run, lease, taken_over) = match with_retry(|| ctx.store.start_child(host.lease, &new, ctx.config.lease)).await
    {
        Ok(ChildStart::Held { run, lease, taken_over }) => (run, lease, taken_over),
        // It ended under the parent's earlier attempt; its answer stands.
        Ok(ChildStart::Ended(run)) => return answer_of(&run),
        Err(e) => return ToolOutcome::error(format!("the sub-agent could not be started: {e}")),
    };
    let parent = ParentStream {
        store: ctx.store.clone(),
        lease: host.lease.clone(),
        call_id: call_id.to_owned(),
        child: run.id,
        path: path.clone(),
    };
    let started = EventBody::SubagentStarted {
        call_id: call_id.to_owned(),
        run_id: run.id,
        agent_path: path.clone(),
        agent: kind.name.clone(),
        description: args.description.clone(),
        taken_over,
    };
    if let Err(e) = parent.write(started).await {
        return ToolOutcome::error(format!("the sub-agent could not be started: {e}"));
    }
    // A child on its first attempt has spent nothing yet: no queries for it.
    let before = if lease.attempt == 1 { Spend::default() } else { spend_of(ctx, &run).await };
    let seat =
        Seat { ctx: ctx.clone(), depth: host.seat.depth + 1, path: path.clone(), slots: host.seat.slots.clone() };
    let ending = drive(&seat, host, kind, &run, &lease, parent.clone()).await;
    let Some((terminal, status)) = terminal_of(&ending, &run) else {
        return ToolOutcome::error("the sub-agent's run was taken over elsewhere; its answer is lost");
    };
    let child = Child { run: &run, lease: &lease, parent: &parent };
    end(host, &child, &terminal, status, before).await
}

/// The call's kind and budget, or why it starts no child.
fn admit<'h>(host: &'h StepHost<'_>, args: &TaskArgs) -> Result<(&'h AgentKind, kiln_protocol::Limits), String> {
    if !host.seat.may_spawn() {
        return Err("the task tool is not available to this agent (the sub-agent depth limit)".into());
    }
    let kind = kind_of(host, args.agent.as_deref())?;
    if args.prompt.trim().is_empty() || args.prompt.contains('\0') {
        return Err("the task's prompt must not be empty or contain NUL characters".into());
    }
    Ok((kind, host.budget.share(kind)?))
}

/// The child's row: its parent's policy, narrowed to its kind.
fn new_child(
    host: &StepHost<'_>,
    kind: &AgentKind,
    call_id: &str,
    path: &str,
    args: &TaskArgs,
    limits: kiln_protocol::Limits,
) -> NewChild {
    NewChild {
        call_id: call_id.to_owned(),
        kind: kind.name.clone(),
        path: path.to_owned(),
        prompt: args.prompt.clone(),
        limits,
        policy: Policy {
            approval: host.run.approval,
            // Over the parent's tools as they are now (built-in and MCP).
            allowed_tools: kinds::allowed_tools(kind, host.run.allowed_tools.as_deref(), &host.tools.current()),
            sandbox: host.run.sandbox.clone(),
            environment: host.run.environment.clone(),
            // The parent's MCP servers: the child uses its connections (see
            // `agent`'s `tools`).
            mcp: host.run.mcp.clone(),
            // Its own children (where the depth allows) get what it got.
            agents: host.run.agents.clone(),
            // The parent's change is delivered with the parent's.
            deliver: None,
            group_limits: None,
        },
    }
}

/// The terminal event and status of a child that ended so; `None`: its
/// lease was lost, and another worker ends it.
fn terminal_of(ending: &Ending, run: &Run) -> Option<(EventBody, RunStatus)> {
    Some(match ending {
        Ending::Finished(Outcome::Succeeded { summary }) => {
            (EventBody::RunSucceeded { summary: summary.clone() }, RunStatus::Succeeded)
        }
        Ending::Finished(Outcome::Failed { error }) | Ending::Error(error) => {
            (EventBody::RunFailed { error: error.clone() }, RunStatus::Failed)
        }
        Ending::Finished(Outcome::TimedOut { limit_s }) => {
            (EventBody::RunTimedOut { limit_s: *limit_s }, RunStatus::TimedOut)
        }
        Ending::TimedOut => (EventBody::RunTimedOut { limit_s: run.limits.timeout_s() }, RunStatus::TimedOut),
        Ending::Cancelled => (EventBody::RunCancelled { reason: "cancelled by client".into() }, RunStatus::Cancelled),
        Ending::LeaseLost => return None,
    })
}

/// A running child, as its end needs it.
struct Child<'a> {
    run: &'a Run,
    lease: &'a Lease,
    parent: &'a ParentStream,
}

/// Writes the child's end, counts what it spent in the parent's budget,
/// tells the parent's stream, and gives the parent its answer.
async fn end(
    host: &StepHost<'_>,
    child: &Child<'_>,
    terminal: &EventBody,
    status: RunStatus,
    before: Spend,
) -> ToolOutcome {
    let (ctx, run) = (&host.seat.ctx, child.run);
    let result = match terminal {
        EventBody::RunSucceeded { summary } => Some(serde_json::json!({ "summary": summary })),
        _ => None,
    };
    if let Err(e) = with_retry(|| ctx.store.finish_run(child.lease, terminal, result.as_ref())).await {
        tracing::warn!(child = %run.id, error = %e, "recording the sub-agent's end failed");
    }
    let after = spend_of(ctx, run).await;
    host.record(&minus(&after, &before));
    let summary = match terminal {
        EventBody::RunSucceeded { summary } => summary.clone(),
        EventBody::RunFailed { error } => error.clone(),
        EventBody::RunTimedOut { limit_s } => format!("the sub-agent ran out of its {limit_s} s of wall clock"),
        _ => "cancelled".to_owned(),
    };
    let path = &child.parent.path;
    let finished = EventBody::SubagentFinished {
        call_id: child.parent.call_id.clone(),
        run_id: run.id,
        agent_path: path.clone(),
        status: status.as_str().to_owned(),
        summary: summary.clone(),
        usage: after.usage,
        cost_usd: after.cost_usd,
        steps: after.steps,
    };
    if let Err(e) = child.parent.write(finished).await {
        tracing::warn!(child = %run.id, error = %e, "announcing the sub-agent's end failed");
    }
    match status {
        RunStatus::Succeeded => ToolOutcome::ok(cut_answer(&summary)),
        _ => ToolOutcome::error(format!("the sub-agent {path} ended {}: {summary}", status.as_str())),
    }
}

/// The kind a call names (`None`: the default), if the run offers it.
fn kind_of<'k>(host: &'k StepHost<'_>, name: Option<&str>) -> Result<&'k AgentKind, String> {
    let all = &host.seat.ctx.config.subagents.kinds;
    let offered = kinds::offered(all, host.run);
    let names = || offered.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ");
    let found = match name {
        Some(name) => offered.iter().find(|k| k.name == name).copied(),
        None => kinds::default_kind(&offered),
    };
    found.ok_or_else(|| match name {
        Some(name) if all.get(name).is_some() => {
            format!("the agent kind {name:?} is not available to this run; it offers: {}", names())
        }
        Some(name) => format!("unknown agent kind {name:?}; this run offers: {}", names()),
        None => "this run offers no agent kinds".to_owned(),
    })
}

/// How a child's loop ended.
enum Ending {
    Finished(Outcome),
    Cancelled,
    TimedOut,
    LeaseLost,
    Error(String),
}

/// Drives the child's loop until it ends, is cancelled (a client cancelled
/// the child itself; a cancelled parent drops this future instead), runs
/// out of time or loses its lease.
async fn drive(
    seat: &Seat,
    host: &StepHost<'_>,
    kind: &AgentKind,
    run: &Run,
    lease: &Lease,
    parent: ParentStream,
) -> Ending {
    let ctx = &seat.ctx;
    let cancel = CancellationToken::new();
    let lost = CancellationToken::new();
    let _heartbeat = RunHeartbeat::start(ctx.clone(), lease.clone(), cancel.clone(), lost.clone());
    let mut events = EventSink::new(ctx.store.clone(), lease.clone());
    events.nest_into(parent);
    let spent = if lease.attempt > 1 { ctx.store.run_event_bytes(run.id).await.unwrap_or(0) } else { 0 };
    events.limit(EventBudget::new(ctx.config.max_event_bytes_per_run, spent));
    let remaining = Duration::from_secs(u64::from(run.limits.timeout_s()))
        .saturating_sub(run.started_at.and_then(|t| (chrono::Utc::now() - t).to_std().ok()).unwrap_or_default());
    let work = async {
        events
            .write_now(EventBody::RunStarted { worker: ctx.config.worker_id.clone(), attempt: lease.attempt })
            .await?;
        let pricing = |model: &str, usage: &kiln_protocol::Usage| ctx.prices.cost(model, usage);
        let outcome = agent(seat, ctx, host, kind, run, lease, &mut events, &pricing).drive().await?;
        events.commit().await?;
        Ok::<_, AgentError>(outcome)
    };
    let ending = tokio::select! {
        result = work => match result {
            Ok(outcome) => Ending::Finished(outcome),
            Err(AgentError::Store(StoreError::LeaseLost(_))) => Ending::LeaseLost,
            Err(e) => Ending::Error(e.to_string()),
        },
        _ = cancel.cancelled() => Ending::Cancelled,
        _ = lost.cancelled() => Ending::LeaseLost,
        _ = tokio::time::sleep(remaining) => Ending::TimedOut,
    };
    // A loop stopped from outside may hold its last step's tool message
    // (for a model call that never came): stored before the child's end,
    // as a top-level run's lifecycle stores it.
    if matches!(ending, Ending::Cancelled | Ending::TimedOut) {
        let _ = events.commit().await;
    }
    ending
}

/// The child's loop: the parent's sandbox, model and settings; its own
/// lease, conversation, role and tools.
#[allow(clippy::too_many_arguments)]
fn agent<'a>(
    seat: &'a Seat,
    ctx: &'a Arc<WorkerContext>,
    host: &'a StepHost<'_>,
    kind: &AgentKind,
    run: &'a Run,
    lease: &'a Lease,
    events: &'a mut EventSink,
    pricing: &'a (dyn Fn(&str, &kiln_protocol::Usage) -> Option<f64> + Send + Sync),
) -> AgentRun<'a> {
    let provider_kind =
        run.model.provider.as_deref().and_then(|p| p.parse().ok()).unwrap_or(ctx.config.default_provider);
    AgentRun {
        store: &ctx.store,
        lease,
        run,
        sandbox: host.sandbox,
        provider: ctx.providers.get(provider_kind),
        model: run.model.name.clone().unwrap_or_else(|| ctx.config.default_model.clone()),
        max_tokens: run.model.max_tokens.unwrap_or(ctx.config.default_max_tokens),
        pricing,
        tools: host.tools,
        events,
        control: Arc::new(Control::default()),
        notice: None,
        system: String::new(),
        agents_md: host.agents_md.clone(),
        role: Some(kind.prompt.clone()),
        read_only: kind.read_only,
        compaction: crate::agent::compaction::Policy {
            context_window: run.model.context_window.unwrap_or(ctx.config.context_window),
            threshold: ctx.config.compaction_threshold,
        },
        max_tool_calls_per_step: ctx.config.max_tool_calls_per_step,
        prompt_cache: ctx.config.prompt_cache,
        seat: Some(seat),
    }
}

/// What `run` has spent so far: its stored steps' usage, priced.
async fn spend_of(ctx: &WorkerContext, run: &Run) -> Spend {
    let usage = with_retry(|| ctx.store.run_usage(run.id)).await.unwrap_or_default();
    let steps = with_retry(|| ctx.store.count_run_messages(run.id, "assistant")).await.unwrap_or(0) as u32;
    let model = run.model.name.clone().unwrap_or_else(|| ctx.config.default_model.clone());
    let cost_usd = if usage == Default::default() { Some(0.0) } else { ctx.prices.cost(&model, &usage) };
    Spend { usage, cost_usd, steps }
}

/// `after` less `before`: what the child spent under this attempt.
fn minus(after: &Spend, before: &Spend) -> Spend {
    let u = |a: u64, b: u64| a.saturating_sub(b);
    Spend {
        usage: kiln_protocol::Usage {
            input_tokens: u(after.usage.input_tokens, before.usage.input_tokens),
            output_tokens: u(after.usage.output_tokens, before.usage.output_tokens),
            cache_read_tokens: u(after.usage.cache_read_tokens, before.usage.cache_read_tokens),
            cache_write_tokens: u(after.usage.cache_write_tokens, before.usage.cache_write_tokens),
        },
        cost_usd: match (after.cost_usd, before.cost_usd) {
            (Some(a), Some(b)) => Some((a - b).max(0.0)),
            _ => None,
        },
        steps: after.steps.saturating_sub(before.steps),
    }
}

/// The parent's result for a child that had already ended.
fn answer_of(run: &Run) -> ToolOutcome {
    let summary = run.result.as_ref().and_then(|r| r.get("summary")).and_then(|s| s.as_str());
    match (run.status, summary) {
        (RunStatus::Succeeded, Some(summary)) => ToolOutcome::ok(cut_answer(summary)),
        (status, _) => ToolOutcome::error(format!(
            "the sub-agent ended {}: {}",
            status.as_str(),
            run.error.as_deref().unwrap_or("no answer")
        )),
    }
}

/// A final answer, cut to what the parent's context should take.
fn cut_answer(text: &str) -> String {
    match text.char_indices().nth(MAX_ANSWER_CHARS) {
        Some((at, _)) => {
            format!("{}\n[kiln: the sub-agent's answer was cut at {MAX_ANSWER_CHARS} characters]", &text[..at])
        }
        None => text.to_owned(),
    }
}
