//! The agent loop: stream the model, run the tools it calls inside the
//! sandbox, persist every message, repeat until the model stops calling
//! tools or the step budget is spent.
//!
//! Messages are the durable state: a run picked up by another worker reloads
//! them and continues from the last checkpoint (`resume`).
//!
//! [`AgentRun::drive`] is the loop: load the history, then per step read the
//! inbox, check the budget, compact if due, stream the model, store its
//! answer and act on how it finished (run the tools it called, ask it to go
//! on, or end). What is not the loop lives beside it: running tool calls in
//! batches (`tool_batch`), the approval gate (`approval`), picking a run up
//! (`resume`), steering (`inbox`), compaction ([`compaction`]), the calls a
//! step may make (`call_limit`). Below it, and not part of it: the run's
//! event writer (`crate::event_sink`, with the bytes of events a run may
//! store), the database retry (`crate::db_retry`), the tools
//! (`crate::tools`, `crate::toolset`) and the interface its `task` tool
//! calls to start sub-agents ([`spawn`], implemented by `crate::subagent`).

mod approval;
mod budget;
mod call_limit;
pub mod compaction;
pub mod control;
mod guard;
mod inbox;
mod model_call;
mod prompt;
mod resume;
pub mod spawn;
mod tool_batch;
mod tool_call;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_protocol::{EventBody, Message, Role, Run, Usage};
use kiln_store::{Lease, Store, StoreError};
use tracing::Instrument;

use crate::db_retry;
use crate::event_sink::{EventSink, NewMessage};
use crate::providers::assemble::Assembled;
use crate::providers::{FinishReason, ModelProvider, ModelRequest, ProviderError};
use crate::sandbox::Sandbox;
use crate::tools::task::TaskRunner;
use crate::tools::{Registry, ToolFailure};
use crate::toolset::Toolset;
use approval::Gate;
pub(crate) use approval::name_matches;
use budget::{Budget, BudgetCheck, Exhausted};
use guard::{LoopGuard, Verdict};
use inbox::InboxWatch;
pub use resume::{ENDED_MID_CALL, INTERRUPTED};
use tool_batch::ToolRunner;
pub use tool_call::ToolCall;

/// Continuations after the output limit cut an answer short, per run.
const MAX_CONTINUATIONS: u32 = 3;
const CONTINUE: &str = "[kiln] Your answer was cut off by the output limit. Continue exactly where you stopped.";

/// How a run's loop ended, when it ended on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded { summary: String },
    Failed { error: String },
    TimedOut { limit_s: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Tool(#[from] ToolFailure),
}

/// Everything one run's loop uses.
pub struct AgentRun<'a> {
    pub store: &'a Store,
    pub lease: &'a Lease,
    pub run: &'a Run,
    pub sandbox: &'a Sandbox,
    pub provider: Arc<dyn ModelProvider>,
    pub model: String,
    pub max_tokens: u32,
    /// Price of one step's usage for `model`; `None` when unknown.
    pub pricing: &'a (dyn Fn(&str, &Usage) -> Option<f64> + Send + Sync),
    /// The built-in tools and the run's MCP tools (shared with its
    /// sub-agents), read once per step: an MCP server may change its list.
    pub tools: &'a Toolset,
    pub events: &'a mut EventSink,
    /// Woken when a client sends the run a message or an approval decision.
    pub control: Arc<control::Control>,
    /// Told to the model (as a stored user message) before the first step,
    /// e.g. that the sandbox is not the one the conversation happened in.
    pub notice: Option<String>,
    /// The system prompt, with the repository's `AGENTS.md`; set by `drive`.
    pub system: String,
    /// The repository's `AGENTS.md` as already read (a sub-agent gets its
    /// parent's); `None`: `drive` reads it from the sandbox.
    pub agents_md: Option<Option<String>>,
    /// When to summarise the older conversation.
    pub compaction: compaction::Policy,
    /// Tool calls of one step that run; the rest are answered unrun.
    pub max_tool_calls_per_step: usize,
    /// Mark the prompt's stable prefix for the provider's cache.
    pub prompt_cache: bool,
    /// A sub-agent's role, added to the system prompt.
    pub role: Option<String>,
    /// Only tools that change nothing (a read-only sub-agent): also those
    /// whose MCP server re-lists them as changing things after it started.
    pub read_only: bool,
    /// The agent's place in its tree of agents, for starting sub-agents
    /// (`task`); `None`: the agent starts none.
    pub seat: Option<&'a dyn spawn::Spawner>,
}

/// What the loop carries from one step to the next.
struct Progress {
    budget: Budget,
    guard: LoopGuard,
    /// Continuations asked for so far (at most [`MAX_CONTINUATIONS`]).
    continuations: u32,
    /// The last step's input, which says whether the next needs room.
    last_input: Option<Usage>,
}

impl<'a> AgentRun<'a> {
    /// Drives the loop to an outcome. Store errors (including a lost lease)
    /// and sandbox failures come back as `Err`; model errors that retries
    /// could not fix become a failed outcome.
    pub async fn drive(mut self) -> Result<Outcome, AgentError> {
        let ended = self.run_loop().await;
        // A step's tool message is held for the next model call to commit
        // beside (`hold`); a loop that ended before that call stores it
        // now. After a store error it is left to the caller's last commit
        // (the database may be back by then); after another error, that
        // error is what the caller hears.
        match ended {
            Ok(_) => self.events.commit().await?,
            Err(AgentError::Store(_)) => {}
            Err(_) => {
                let _ = self.events.commit().await;
            }
        }
        ended
    }

    /// Resumes the conversation and takes steps until the run ends.
    async fn run_loop(&mut self) -> Result<Outcome, AgentError> {
        let mut messages = self.resume().await?;
        // Read once per attempt: the model may edit AGENTS.md, and the
        // prompt should not change under it mid-run.
        // A sub-agent takes its parent's: the same prompt, and no read of
        // the sandbox on its start, which children started together would
        // otherwise queue for (one `docker exec` each).
        if self.agents_md.is_none() {
            self.agents_md = Some(prompt::load_agents_md(self.sandbox).await);
        }
        self.system = prompt::system_prompt(self.agents_md.clone().flatten().as_deref());
        if let Some(role) = &self.role {
            self.system = format!("{}\n\n# Your role\n\n{role}", self.system);
        }
        if let Some(text) = self.notice.take() {
            self.persist(&mut messages, Message::user(text)).await?;
        }
        let budget = self.budget_so_far().await?;
        let mut progress = Progress { budget, guard: LoopGuard::default(), continuations: 0, last_input: None };
        let mut inbox = InboxWatch::default();
        loop {
            self.read_inbox(&mut inbox, &mut messages).await?;
            if let Some(outcome) = finished(&messages) {
                return Ok(outcome);
            }
            // Before any model call: past the event budget nothing the run
            // does could be recorded.
            if let Some(error) = self.events.exhausted() {
                return Ok(Outcome::Failed { error });
            }
            let note = match progress.budget.check(self.elapsed()) {
                BudgetCheck::Ok => None,
                BudgetCheck::Warn(note) => Some(note),
                BudgetCheck::Exhausted(Exhausted::Time { limit_s }) => return Ok(Outcome::TimedOut { limit_s }),
                BudgetCheck::Exhausted(Exhausted::Budget(reason)) => return Ok(Outcome::Failed { error: reason }),
            };
            if let Some(input) = progress.last_input.take().filter(|u| self.compaction.due(u)) {
                self.compact(&mut messages, &input, &mut progress.budget).await?;
                // Compacting is a model call too: the budget is checked
                // again before the step, so a compacting step overshoots by
                // at most that one call.
                continue;
            }
            if let ControlFlow::Break(outcome) = self.step(&mut messages, &mut progress, note).await? {
                return Ok(outcome);
            }
        }
    }

    /// The run's budget, with what its earlier attempts spent.
    async fn budget_so_far(&self) -> Result<Budget, AgentError> {
        let mut budget = Budget::new(self.run.limits);
        // A first attempt starts from nothing: attempts only count up, and
        // only an attempt stores the run's steps or starts its children.
        // Three queries fewer on every run's start (four children starting
        // together queued for them).
        if self.lease.attempt == 1 {
            return Ok(budget);
        }
        budget.steps = db_retry::with_retry(|| self.store.count_run_messages(self.run.id, "assistant")).await? as u32;
        let earlier = db_retry::with_retry(|| self.store.run_usage(self.run.id)).await?;
        // A run keeps its model, and prices are per token: the earlier
        // attempts' usage priced as a whole costs what their steps cost.
        // Nothing spent costs nothing, even for a model without a price.
        let cost = if earlier == Usage::default() { Some(0.0) } else { (self.pricing)(&self.model, &earlier) };
        budget.record(&earlier, cost);
        // What its sub-agents spent counts too (they use the run's model).
        let (children, child_steps) = db_retry::with_retry(|| self.store.children_spend(self.run.id)).await?;
        let cost = if children == Usage::default() { Some(0.0) } else { (self.pricing)(&self.model, &children) };
        budget.record(&children, cost);
        budget.child_steps = child_steps;
        Ok(budget)
    }

    /// One step in its own span, which times it and parents its model and
    /// tool calls. `Break` ends the run.
    async fn step(
        &mut self,
        messages: &mut Vec<Message>,
        progress: &mut Progress,
        note: Option<String>,
    ) -> Result<ControlFlow<Outcome>, AgentError> {
        progress.budget.steps += 1;
        let step = progress.budget.steps;
        // Lines logged before the next step still say which step the run is at.
        tracing::Span::current().record("step", step);
        let span = tracing::info_span!(
            "step",
            run_id = %self.run.id,
            session_id = %self.run.session_id,
            step,
            finish_reason = tracing::field::Empty,
            tool_calls = tracing::field::Empty,
        );
        let started = Instant::now();
        let next = self.take_step(step, messages, progress, note).instrument(span).await;
        crate::metrics::step_finished(started.elapsed());
        next
    }

    /// Streams the model, stores its answer and acts on it.
    async fn take_step(
        &mut self,
        step: u32,
        messages: &mut Vec<Message>,
        progress: &mut Progress,
        note: Option<String>,
    ) -> Result<ControlFlow<Outcome>, AgentError> {
        // Goes out with the model's first output (or within 50 ms).
        self.events.write_soon(EventBody::StepStarted { step }).await?;
        // An MCP server that changed its tools since the last step: the
        // model is offered the new list from this step on.
        self.tools.refresh().await;
        let answer = match self.call_model(step, messages, note).await {
            Ok(answer) => answer,
            Err(AgentError::Provider(e)) => {
                return Ok(ControlFlow::Break(Outcome::Failed { error: format!("model call failed: {e}") }));
            }
            Err(e) => return Err(e),
        };
        let calls = self.record_answer(step, &answer, messages, progress).await?;
        self.act_on_answer(&answer, &calls, messages, progress).await
    }

    /// Step `step`'s model call with the conversation so far, plus a
    /// transient budget note (sent, not stored).
    async fn call_model(
        &mut self,
        step: u32,
        messages: &[Message],
        note: Option<String>,
    ) -> Result<Assembled, AgentError> {
        let mut request_messages = messages.to_vec();
        if let Some(note) = note {
            request_messages.push(Message::user(note));
        }
        let request = ModelRequest {
            model: self.model.clone(),
            system: self.system.clone(),
            messages: request_messages,
            tools: self.tool_specs(),
            max_tokens: self.max_tokens,
            temperature: self.run.model.temperature,
            // One key per session: its runs share the conversation's prefix.
            cache_key: self.prompt_cache.then(|| self.run.session_id.to_string()),
        };
        model_call::call_model(self.provider.as_ref(), &request, self.events, step).await
    }

    /// Counts what the answer cost and stores it with the step's events;
    /// the tool calls it makes.
    async fn record_answer(
        &mut self,
        step: u32,
        answer: &Assembled,
        messages: &mut Vec<Message>,
        progress: &mut Progress,
    ) -> Result<Vec<ToolCall>, AgentError> {
        let finish = finish_reason(answer);
        let cost = (self.pricing)(&self.model, &answer.usage);
        progress.budget.record(&answer.usage, cost);
        progress.last_input = Some(answer.usage);
        let step_finished = EventBody::StepFinished {
            step,
            finish_reason: finish.as_str().to_owned(),
            usage: answer.usage,
            cost_usd: cost,
        };
        let calls = ToolCall::all_in(&answer.message);
        let message = NewMessage {
            session_id: self.run.session_id,
            message: answer.message.clone(),
            usage: Some(answer.usage),
            model: Some(self.model.clone()),
        };
        // The message, the step's events and its end share a commit. With
        // tool calls it waits for the first `tool_call.ready` (written
        // before the tool runs) to share that one too.
        if calls.is_empty() {
            self.events.write_message(message, vec![step_finished]).await?;
        } else {
            self.events.hold_message(message, vec![step_finished]).await?;
        }
        messages.push(answer.message.clone());
        tracing::Span::current().record("finish_reason", finish.as_str()).record("tool_calls", calls.len());
        Ok(calls)
    }

    /// Acts on how the model finished: runs the tools it called, tells it
    /// about calls that never completed, applies the loop guard, and asks
    /// it to go on after an answer the output limit cut short. An answer
    /// without calls ends the run at the top of the loop, unless a message
    /// came in meanwhile.
    async fn act_on_answer(
        &mut self,
        answer: &Assembled,
        calls: &[ToolCall],
        messages: &mut Vec<Message>,
        progress: &mut Progress,
    ) -> Result<ControlFlow<Outcome>, AgentError> {
        let verdict = progress.guard.observe(calls);
        if !calls.is_empty() {
            let host = self.step_host(&progress.budget, calls);
            let results = self.tool_runner_with(host.as_deref()).run(self.events, calls).await?;
            // What the step's sub-agents spent is the run's spending too.
            if let Some(spent) = host.map(|h| h.take_spent()) {
                progress.budget.record(&spent.usage, spent.cost_usd);
                progress.budget.child_steps += spent.steps;
            }
            self.hold(messages, results).await?;
        }
        if !answer.rejected_calls.is_empty() {
            // Not stored as tool calls (they never completed), so the model
            // is told in a user message instead of tool results.
            let text = answer
                .rejected_calls
                .iter()
                .map(|r| format!("Your call to {} was not run: {}", r.name, r.error))
                .collect::<Vec<_>>()
                .join("\n");
            self.persist(messages, Message::user(text)).await?;
        }
        match verdict {
            Verdict::Continue => {}
            Verdict::Nudge(text) => self.persist(messages, Message::user(text)).await?,
            Verdict::Stop(reason) => return Ok(ControlFlow::Break(Outcome::Failed { error: reason })),
        }
        let cut_short = finish_reason(answer) == FinishReason::MaxTokens && calls.is_empty();
        if cut_short && progress.continuations < MAX_CONTINUATIONS {
            progress.continuations += 1;
            self.persist(messages, Message::user(CONTINUE)).await?;
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Wall clock since the run first started (across attempts).
    fn elapsed(&self) -> Duration {
        self.run.started_at.and_then(|t| (chrono::Utc::now() - t).to_std().ok()).unwrap_or_default()
    }

    /// The approval gate, for this run and its tools as they are now.
    fn gate(&self) -> Gate<'a> {
        self.gate_over(self.tools.current())
    }

    /// The approval gate, for this run and `tools`.
    fn gate_over(&self, tools: Arc<Registry>) -> Gate<'a> {
        Gate {
            store: self.store,
            lease: self.lease,
            run: self.run,
            tools,
            read_only: self.read_only,
            control: self.control.clone(),
        }
    }

    /// What runs this run's tool calls, with `subagents` for its `task` calls.
    fn tool_runner_with<'h>(&self, subagents: Option<&'h (dyn spawn::StepTasks + 'a)>) -> ToolRunner<'h>
    where
        'a: 'h,
    {
        // One registry for the gate and the calls: the step's.
        let tools = self.tools.current();
        ToolRunner {
            gate: self.gate_over(tools.clone()),
            sandbox: self.sandbox,
            tools,
            max_calls: self.max_tool_calls_per_step,
            subagents: subagents.map(|tasks| tasks as &dyn TaskRunner),
        }
    }

    /// What the `task` calls among `calls` start sub-agents with: each gets
    /// an even share of what `budget` has left.
    fn step_host(&self, budget: &Budget, calls: &[ToolCall]) -> Option<Box<dyn spawn::StepTasks + 'a>> {
        let seat = self.seat.filter(|seat| seat.may_spawn())?;
        let tasks = calls.iter().filter(|c| c.name == crate::tools::task::NAME).count();
        if tasks == 0 {
            return None;
        }
        let spent = spawn::Spent {
            steps: budget.steps + budget.child_steps,
            tokens: budget.tokens(),
            cost_usd: budget.cost_usd,
            elapsed: self.elapsed(),
        };
        Some(seat.step(spawn::Step {
            run: self.run,
            lease: self.lease,
            sandbox: self.sandbox,
            tools: self.tools,
            agents_md: self.agents_md.clone(),
            limits: *budget.limits(),
            spent,
            children: tasks as u32,
        }))
    }

    /// The tools the model is shown: all, or the run's `allowed_tools`;
    /// `task` only to an agent that may start sub-agents, offering the
    /// kinds the run does (none: no `task`).
    fn tool_specs(&self) -> Vec<crate::providers::ToolSpec> {
        let gate = self.gate();
        let offered = match self.seat.filter(|seat| seat.may_spawn()) {
            Some(seat) => seat.offered(self.run),
            None => Vec::new(),
        };
        shown_tools(&gate.tools, |name| gate.allows(name), &offered)
    }

    /// Stores `message` (with the events buffered, e.g. tool results) and
    /// adds it to the conversation.
    async fn persist(&mut self, messages: &mut Vec<Message>, message: Message) -> Result<(), AgentError> {
        self.hold(messages, message).await?;
        Ok(self.events.commit().await?)
    }

    /// Adds `message` to the conversation and holds it (with the events
    /// buffered, e.g. tool results) for the next commit. The next model
    /// call makes that commit while its request goes out (`model_call`),
    /// so a step's tool message costs the loop no wait of its own; every
    /// other writer of the session commits it first (`read_inbox`), and a
    /// loop that ends before the next call commits it in `drive`.
    async fn hold(&mut self, messages: &mut Vec<Message>, message: Message) -> Result<(), AgentError> {
        self.events.hold_message(NewMessage::plain(self.run.session_id, message.clone()), Vec::new()).await?;
        messages.push(message);
        Ok(())
    }
}

/// A request that starts as a run's first step does when its repository
/// has no `AGENTS.md` and every tool of `tools` is allowed: the same system
/// prompt and tool definitions, byte for byte, then `prompt`. A local model
/// server given it ahead of the first run holds that prefix in its cache.
/// `kinds` are the deployment's agent kinds (a top-level run offers them all
/// in its `task` tool unless it narrows them).
pub fn first_step_request(
    model: &str,
    tools: &Registry,
    kinds: &kiln_protocol::agents::AgentKinds,
    prompt: &str,
    max_tokens: u32,
) -> ModelRequest {
    ModelRequest {
        model: model.to_owned(),
        system: prompt::system_prompt(None),
        messages: vec![Message::user(prompt)],
        tools: shown_tools(tools, |_| true, &kinds.offered(None)),
        max_tokens,
        temperature: None,
        cache_key: None,
    }
}

/// The tool definitions a model is shown, in the registry's fixed order:
/// those `allows` lets through, with `task` described for the `offered`
/// kinds (none offered: no `task`). One function for the loop and the
/// local model's warm-up, so both send the same bytes.
fn shown_tools(
    tools: &Registry,
    allows: impl Fn(&str) -> bool,
    offered: &[&kiln_protocol::agents::AgentKind],
) -> Vec<crate::providers::ToolSpec> {
    use crate::tools::task;
    tools
        .specs()
        .iter()
        .filter(|spec| allows(&spec.name))
        .filter_map(|spec| match spec.name == task::NAME {
            false => Some(spec.clone()),
            true if offered.is_empty() => None,
            true => Some(task::spec_for(offered)),
        })
        .collect()
}

/// How the model said it stopped; a stream without a reason ended its turn.
fn finish_reason(answer: &Assembled) -> FinishReason {
    answer.finish_reason.clone().unwrap_or(FinishReason::EndTurn)
}

/// The run is done when the last message is the model's answer without tool
/// calls (a reclaimed run whose previous worker died after the final answer).
fn finished(messages: &[Message]) -> Option<Outcome> {
    let last = messages.last()?;
    (last.role == Role::Assistant && last.tool_calls().next().is_none())
        .then(|| Outcome::Succeeded { summary: last.text() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_protocol::Part;

    #[test]
    fn a_final_answer_without_tool_calls_finishes_the_run() {
        let answer = Message { role: Role::Assistant, parts: vec![Part::Text { text: "done".into() }] };
        assert_eq!(finished(&[answer]), Some(Outcome::Succeeded { summary: "done".into() }));
        let call = Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "1".into(),
                name: "bash".into(),
                arguments: serde_json::json!({}),
                provider_id: None,
            }],
        };
        assert_eq!(finished(&[call]), None);
        assert_eq!(finished(&[Message::user("hi")]), None);
    }
}
