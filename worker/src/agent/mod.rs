//! The agent loop: stream the model, run the tools it calls inside the
//! sandbox, persist every message, repeat until the model stops calling
//! tools or the step budget is spent.
//!
//! Messages are the durable state: a run picked up by another worker reloads
//! them and continues from the last checkpoint.

mod budget;
pub mod compaction;
pub mod control;
mod db_retry;
pub mod events;
mod guard;
mod model_call;
mod prompt;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_protocol::{ApprovalMode, EventBody, Message, Part, Role, Run, Usage};
use kiln_store::{Decision, Lease, Store, StoreError};

use crate::providers::assemble::Assembled;
use crate::providers::{FinishReason, ModelProvider, ModelRequest, ProviderError};
use crate::sandbox::Sandbox;
use crate::tools::{OutputStream, Registry, ToolContext, ToolFailure, ToolOutcome};
use budget::{Budget, BudgetCheck, Exhausted};
use events::EventSink;
use guard::{LoopGuard, Verdict};
use tracing::Instrument;

/// Said to the model for a call whose result was never stored because the
/// worker running it died (DESIGN.md §6): it must not be re-run blindly.
pub const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

/// Said to the model, in a follow-up, for a call of the earlier run that was
/// still running when that run ended: its result was never stored.
pub const ENDED_MID_CALL: &str = "interrupted: the run ended (cancelled, timed out or failed) while this call was \
     running; it may or may not have completed";

/// How often a run waiting for approval re-reads the decision.
const APPROVAL_POLL: Duration = Duration::from_secs(1);
/// Longest the loop goes without looking at the inbox when no message was
/// announced (a missed notification costs at most this much delay).
const INBOX_POLL: Duration = Duration::from_secs(1);
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
    pub tools: &'a Registry,
    pub events: &'a mut EventSink,
    /// Woken when a client sends the run a message or an approval decision.
    pub control: Arc<control::Control>,
    /// Told to the model (as a stored user message) before the first step,
    /// e.g. that the sandbox is not the one the conversation happened in.
    pub notice: Option<String>,
    /// The system prompt, with the repository's `AGENTS.md`; set by `drive`.
    pub system: String,
    /// When to summarise the older conversation.
    pub compaction: compaction::Policy,
}

impl AgentRun<'_> {
    /// Drives the loop to an outcome. Store errors (including a lost lease)
    /// and sandbox failures come back as `Err`; model errors that retries
    /// could not fix become a failed outcome.
    pub async fn drive(mut self) -> Result<Outcome, AgentError> {
        let mut messages = self.resume().await?;
        // Read once per attempt: the model may edit AGENTS.md, and the
        // prompt should not change under it mid-run.
        self.system = prompt::system_prompt(prompt::load_agents_md(self.sandbox).await.as_deref());
        if let Some(text) = self.notice.take() {
            self.persist(&mut messages, Message::user(text)).await?;
        }
        let mut budget = Budget::new(self.run.limits);
        budget.steps = db_retry::with_retry(|| self.store.count_run_messages(self.run.id, "assistant")).await? as u32;
        budget.record(&db_retry::with_retry(|| self.store.run_usage(self.run.id)).await?, None);
        // Spend before a resume is unpriced here; count it as known zero cost
        // only when there was none.
        if budget.tokens() == 0 {
            budget.cost_usd = Some(0.0);
        }
        let mut guard = LoopGuard::default();
        let mut continuations = 0;
        // The last step's input, which says whether the next needs room.
        let mut last_input: Option<Usage> = None;
        let mut inbox_checked = None;
        loop {
            // Steering: messages sent while the run works join the
            // conversation before the next model call (and keep a run that
            // was about to finish going).
            // Looked at when a message was announced (NOTIFY), at least
            // every INBOX_POLL in case an announcement was missed, and always
            // before the run would end: a round trip saved on most steps.
            let announced = self.control.announced();
            let due =
                inbox_checked.is_none_or(|(at, seen): (Instant, u64)| seen != announced || at.elapsed() >= INBOX_POLL);
            if due || finished(&messages).is_some() {
                inbox_checked = Some((Instant::now(), announced));
                let unread = db_retry::with_retry(|| self.store.unread_inbox(self.run.id)).await?;
                if !unread.is_empty() {
                    // Consumed in the commit that stores them: the same
                    // messages on a retry, so it stores nothing twice.
                    db_retry::with_retry(|| self.store.consume_inbox(self.lease, self.run.session_id, &unread)).await?;
                    messages.extend(unread.into_iter().map(|m| Message::user(m.text)));
                }
            }
            if let Some(outcome) = finished(&messages) {
                return Ok(outcome);
            }
            let note = match budget.check(self.elapsed()) {
                BudgetCheck::Ok => None,
                BudgetCheck::Warn(note) => Some(note),
                BudgetCheck::Exhausted(Exhausted::Time { limit_s }) => return Ok(Outcome::TimedOut { limit_s }),
                BudgetCheck::Exhausted(Exhausted::Budget(reason)) => return Ok(Outcome::Failed { error: reason }),
            };
            if let Some(input) = last_input.take().filter(|u| self.compaction.due(u)) {
                self.compact(&mut messages, &input, &mut budget).await?;
            }
            budget.steps += 1;
            let step = budget.steps;
            // Lines logged before the next step still say which step the
            // run is at; the step's own span times it and parents its calls.
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
            let stepped: Result<Option<Outcome>, AgentError> = async {
                // Goes out with the model's first output (or within 50 ms).
                self.events.emit_soon(EventBody::StepStarted { step }).await?;
                let assembled = match self.call_model(&messages, note).await {
                    Ok(a) => a,
                    Err(AgentError::Provider(e)) => {
                        return Ok(Some(Outcome::Failed { error: format!("model call failed: {e}") }));
                    }
                    Err(e) => return Err(e),
                };
                let finish = assembled.finish_reason.clone().unwrap_or(FinishReason::EndTurn);
                let cost = (self.pricing)(&self.model, &assembled.usage);
                budget.record(&assembled.usage, cost);
                last_input = Some(assembled.usage);
                self.events.queue_for_next_write(EventBody::StepFinished {
                    step,
                    finish_reason: finish.as_str().to_owned(),
                    usage: assembled.usage,
                    cost_usd: cost,
                });
                let calls: Vec<(String, String, serde_json::Value)> = assembled
                    .message
                    .tool_calls()
                    .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.clone()))
                    .collect();
                // The message, the step's events and its end share a commit.
                // With tool calls it waits for the first `tool_call.ready`
                // (written before the tool runs) to share that one too.
                let (message, usage, model) =
                    (assembled.message.clone(), Some(assembled.usage), Some(self.model.clone()));
                if calls.is_empty() {
                    self.events.append_message(self.run.session_id, message, usage, model).await?;
                } else {
                    self.events.stage_message(self.run.session_id, message, usage, model).await?;
                }
                messages.push(assembled.message.clone());
                tracing::Span::current().record("finish_reason", finish.as_str()).record("tool_calls", calls.len());
                let verdict = guard.observe(calls.iter().map(|(_, name, args)| (name.as_str(), args)));
                if !calls.is_empty() {
                    let results = self.run_tools(calls).await?;
                    self.persist(&mut messages, results).await?;
                }
                if !assembled.rejected_calls.is_empty() {
                    // Not stored as tool calls (they never completed), so the
                    // model is told in a user message instead of tool results.
                    let text = assembled
                        .rejected_calls
                        .iter()
                        .map(|r| format!("Your call to {} was not run: {}", r.name, r.error))
                        .collect::<Vec<_>>()
                        .join("\n");
                    self.persist(&mut messages, Message::user(text)).await?;
                }
                match verdict {
                    Verdict::Continue => {}
                    Verdict::Nudge(text) => self.persist(&mut messages, Message::user(text)).await?,
                    Verdict::Stop(reason) => return Ok(Some(Outcome::Failed { error: reason })),
                }
                let cut_short = finish == FinishReason::MaxTokens && assembled.message.tool_calls().next().is_none();
                if cut_short && continuations < MAX_CONTINUATIONS {
                    continuations += 1;
                    self.persist(&mut messages, Message::user(CONTINUE)).await?;
                }
                Ok(None)
            }
            .instrument(span)
            .await;
            crate::metrics::step_finished(started.elapsed());
            if let Some(outcome) = stepped? {
                return Ok(outcome);
            }
        }
    }

    /// One model call with the conversation so far, plus a transient budget
    /// note (sent, not stored).
    async fn call_model(&mut self, messages: &[Message], note: Option<String>) -> Result<Assembled, AgentError> {
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
        };
        model_call::call_model(self.provider.as_ref(), &request, self.events).await
    }

    /// Summarises the older part of the conversation and continues from the
    /// summary plus the recent messages. A failed summarising call leaves
    /// the conversation as it is (the next step may still fit).
    async fn compact(
        &mut self,
        messages: &mut Vec<Message>,
        input: &Usage,
        budget: &mut Budget,
    ) -> Result<(), AgentError> {
        let Some(cut) = compaction::cut_point(messages, &self.compaction) else { return Ok(()) };
        let request = ModelRequest {
            model: self.model.clone(),
            system: compaction::PROMPT.to_owned(),
            messages: vec![Message::user(compaction::transcript(&messages[..cut], &self.compaction))],
            tools: Vec::new(),
            max_tokens: self.max_tokens,
            temperature: None,
        };
        let assembled = match model_call::call_model_quietly(self.provider.as_ref(), &request, self.events).await {
            Ok(a) => a,
            Err(AgentError::Provider(e)) => {
                tracing::warn!(run_id = %self.run.id, error = %e, "compaction failed; going on without it");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let summary = assembled.message.text();
        if summary.trim().is_empty() {
            tracing::warn!(run_id = %self.run.id, "the model's summary was empty; not compacting");
            return Ok(());
        }
        let cost = (self.pricing)(&self.model, &assembled.usage);
        budget.record(&assembled.usage, cost);
        let summary = compaction::summary_message(&summary);
        let kept = messages.len() - cut;
        let message_id = uuid::Uuid::now_v7();
        db_retry::with_retry(|| {
            self.store.append_summary(
                self.lease,
                message_id,
                self.run.session_id,
                &summary,
                kept,
                Some(&assembled.usage),
                Some(&self.model),
            )
        })
        .await?;
        let recent = messages.split_off(cut);
        *messages = std::iter::once(summary).chain(recent).collect();
        self.events
            .emit(EventBody::Compaction {
                summarized_messages: cut as u32,
                kept_messages: kept as u32,
                input_tokens: input.input_tokens + input.cache_read_tokens + input.cache_write_tokens,
                usage: assembled.usage,
                cost_usd: cost,
            })
            .await?;
        Ok(())
    }

    /// Wall clock since the run first started (across attempts).
    fn elapsed(&self) -> Duration {
        self.run.started_at.and_then(|t| (chrono::Utc::now() - t).to_std().ok()).unwrap_or_default()
    }

    /// Loads the conversation; answers the tool calls left without results;
    /// on the run's first attempt adds its prompt.
    ///
    /// The answers go first: every tool call must have its result before
    /// anything else joins the conversation, or the providers refuse it
    /// (a follow-up to a run cancelled mid-call would otherwise put its
    /// prompt between the call and its answer).
    async fn resume(&mut self) -> Result<Vec<Message>, AgentError> {
        let mut messages = db_retry::with_retry(|| self.store.load_messages(self.run.session_id)).await?;
        let first_attempt = db_retry::with_retry(|| self.store.count_run_messages(self.run.id, "user")).await? == 0;
        let unanswered = unanswered_calls(&messages);
        if !unanswered.is_empty() {
            // A call that had to wait for a person and was never let through
            // certainly did not run: it goes through the gate again (a
            // decision already made stands) and runs if approved. Any other
            // may have run and is not run again blindly. On a run's first
            // attempt the calls are an earlier run's, which ended (cancelled,
            // timed out, failed) while they ran: none of them runs now.
            let rerun: Vec<_> = if first_attempt {
                Vec::new()
            } else {
                let started = db_retry::with_retry(|| self.store.started_approved_calls(self.run.id)).await?;
                unanswered
                    .iter()
                    .filter(|(id, name, _)| {
                        (!self.tool_allowed(name) || self.needs_approval(name)) && !started.contains(id)
                    })
                    .cloned()
                    .collect()
            };
            let mut ran: HashMap<String, Part> = HashMap::new();
            if !rerun.is_empty() {
                for part in self.run_tools(rerun).await?.parts {
                    if let Part::ToolResult { call_id, .. } = &part {
                        ran.insert(call_id.clone(), part);
                    }
                }
            }
            let output = if first_attempt { ENDED_MID_CALL } else { INTERRUPTED };
            let mut parts = Vec::with_capacity(unanswered.len());
            for (id, name, _) in unanswered {
                if let Some(part) = ran.remove(&id) {
                    parts.push(part);
                    continue;
                }
                // Announced in the tool message's commit: a repeated takeover
                // cannot repeat the event without the message.
                self.events.queue_for_next_write(EventBody::ToolResult {
                    call_id: id.clone(),
                    name: name.clone(),
                    output: output.into(),
                    is_error: true,
                    duration_ms: 0,
                });
                parts.push(Part::ToolResult { call_id: id, name, output: output.into(), is_error: true });
            }
            self.persist(&mut messages, Message { role: Role::Tool, parts }).await?;
        }
        if first_attempt {
            self.persist(&mut messages, Message::user(self.run.prompt.clone())).await?;
        }
        Ok(messages)
    }

    /// Runs one step's calls: consecutive read-only calls together, calls
    /// that change things one at a time, in the model's order. Results go
    /// back in that order too.
    async fn run_tools(&mut self, calls: Vec<(String, String, serde_json::Value)>) -> Result<Message, AgentError> {
        let mut parts = Vec::with_capacity(calls.len());
        let mut rest = calls.as_slice();
        while !rest.is_empty() {
            let read_only = |(_, name, _): &(String, String, serde_json::Value)| {
                self.tools.get(name).is_some_and(|t| !t.is_mutating())
            };
            let batch_len = if read_only(&rest[0]) { rest.iter().take_while(|c| read_only(c)).count() } else { 1 };
            let (batch, tail) = rest.split_at(batch_len);
            rest = tail;
            let mut clearances = Vec::with_capacity(batch.len());
            for (call_id, name, arguments) in batch {
                self.events
                    .emit(EventBody::ToolCallReady {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    })
                    .await?;
                clearances.push(self.gate(call_id, name, arguments).await?);
            }
            if clearances.iter().any(Clearance::asked) {
                // The approved calls are marked as started as the run goes
                // back to `running`: a takeover from here on cannot know
                // whether they ran, and one before this lets them through
                // the gate again (see `resume`).
                let starting: Vec<String> = batch
                    .iter()
                    .zip(&clearances)
                    .filter(|(_, c)| matches!(c, Clearance::Approved))
                    .map(|((call_id, _, _), _)| call_id.clone())
                    .collect();
                self.store.resume_after_approval(self.lease, &starting).await?;
            }
            let verdicts: Vec<Option<ToolOutcome>> = clearances.into_iter().map(Clearance::refusal).collect();
            let (sandbox, tools) = (self.sandbox, self.tools);
            let stream = OutputStream::default();
            let work =
                futures::future::join_all(batch.iter().zip(verdicts).map(|((call_id, name, arguments), verdict)| {
                    let ctx = ToolContext { sandbox, output: Some(stream.sink(call_id)) };
                    // Labels only for tools that exist: the model can make up names.
                    let label = if tools.get(name).is_some() { name.clone() } else { "unknown".to_owned() };
                    let span = tracing::info_span!(
                        "tool_call",
                        tool = %label,
                        call_id = %call_id,
                        outcome = tracing::field::Empty,
                        duration_ms = tracing::field::Empty,
                    );
                    async move {
                        let started = Instant::now();
                        let refused = verdict.is_some();
                        let outcome = match verdict {
                            // Refused before it ran (not allowed, or denied).
                            Some(refusal) => Ok(refusal),
                            None => tools.call(&ctx, name, arguments.clone()).await,
                        };
                        let took = started.elapsed();
                        let result = match &outcome {
                            Err(_) => "failure",
                            Ok(_) if refused => "refused",
                            Ok(o) if o.is_error => "error",
                            Ok(_) => "ok",
                        };
                        tracing::Span::current()
                            .record("outcome", result)
                            .record("duration_ms", took.as_millis() as u64);
                        crate::metrics::tool_call(label, result, took);
                        (outcome, took)
                    }
                    .instrument(span)
                }));
            // Streamed command output becomes tool.output events while the batch runs.
            let outcomes = stream.forward(work, &mut *self.events).await?;
            for ((call_id, name, arguments), (outcome, took)) in batch.iter().zip(outcomes) {
                let outcome = outcome?;
                if name == crate::tools::todo::NAME
                    && !outcome.is_error
                    && let Ok(items) = crate::tools::todo::items(arguments)
                {
                    self.events.emit_soon(EventBody::Todo { items }).await?;
                }
                // Goes out with the next write: the next step's start, or
                // within 50 ms.
                self.events
                    .emit_soon(EventBody::ToolResult {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        output: outcome.output.clone(),
                        is_error: outcome.is_error,
                        duration_ms: took.as_millis() as u64,
                    })
                    .await?;
                parts.push(Part::ToolResult {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    output: outcome.output,
                    is_error: outcome.is_error,
                });
            }
        }
        Ok(Message { role: Role::Tool, parts })
    }

    /// Whether a call may run. Calls outside `allowed_tools` are refused;
    /// calls the run's approval mode covers wait (the run in
    /// `awaiting_approval`) for a person. The caller puts the run back to
    /// `running` ([`Clearance::asked`]) once its batch is cleared.
    async fn gate(
        &mut self,
        call_id: &str,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Result<Clearance, AgentError> {
        if !self.tool_allowed(name) {
            let refusal = ToolOutcome::error(format!("the tool {name:?} is not available in this run"));
            return Ok(Clearance::Refused { outcome: refusal, asked: false });
        }
        if !self.needs_approval(name) {
            return Ok(Clearance::Free);
        }
        // The store writes `approval.requested` itself: what is queued first.
        self.events.flush().await?;
        let decision = match self.store.request_approval(self.lease, call_id, name, arguments).await? {
            Some(decision) => decision,
            None => self.wait_for_decision(call_id).await?,
        };
        if decision.approved {
            return Ok(Clearance::Approved);
        }
        let why = decision.reason.map(|r| format!(": {r}")).unwrap_or_default();
        Ok(Clearance::Refused { outcome: ToolOutcome::error(format!("the user denied this call{why}")), asked: true })
    }

    /// Whether the run's approval mode makes a call of `name` wait for a person.
    fn needs_approval(&self, name: &str) -> bool {
        let mutating = self.tools.get(name).is_none_or(|t| t.is_mutating());
        match self.run.approval {
            ApprovalMode::Never => false,
            ApprovalMode::Mutating => mutating,
            ApprovalMode::Always => true,
        }
    }

    /// Waits for a person's decision; woken by NOTIFY, with polling in case
    /// the notification was missed. Cancellation and the wall clock still
    /// apply (the run task stops this future).
    async fn wait_for_decision(&self, call_id: &str) -> Result<Decision, AgentError> {
        loop {
            tokio::select! {
                _ = self.control.wait() => {}
                _ = tokio::time::sleep(APPROVAL_POLL) => {}
            }
            match self.store.approval_decision(self.run.id, call_id).await {
                Ok(Some(decision)) => return Ok(decision),
                Ok(None) => {}
                // The wait is for a person, who may take hours: a database
                // restart meanwhile is no reason to end the run. The lease
                // runs out if the database stays away (the heartbeat).
                Err(e) if e.is_unavailable() => tracing::warn!(error = %e, "reading the decision failed; waiting on"),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn tool_allowed(&self, name: &str) -> bool {
        self.run.allowed_tools.as_ref().is_none_or(|allowed| allowed.iter().any(|t| t == name))
    }

    /// The tools the model is shown: all, or the run's `allowed_tools`.
    fn tool_specs(&self) -> Vec<crate::providers::ToolSpec> {
        self.tools.specs().into_iter().filter(|spec| self.tool_allowed(&spec.name)).collect()
    }

    /// Stores `message` (with the events waiting, e.g. tool results) and
    /// adds it to the conversation.
    async fn persist(&mut self, messages: &mut Vec<Message>, message: Message) -> Result<(), AgentError> {
        self.events.append_message(self.run.session_id, message.clone(), None, None).await?;
        messages.push(message);
        Ok(())
    }
}

/// What the gate said about a call.
enum Clearance {
    /// It needs nobody's approval.
    Free,
    /// A person approved it.
    Approved,
    /// It does not run: the tool is not allowed, or a person denied it.
    Refused { outcome: ToolOutcome, asked: bool },
}

impl Clearance {
    /// Whether a person was asked (the run went to `awaiting_approval`).
    fn asked(&self) -> bool {
        matches!(self, Clearance::Approved | Clearance::Refused { asked: true, .. })
    }

    /// The result a refused call gets instead of running.
    fn refusal(self) -> Option<ToolOutcome> {
        match self {
            Clearance::Refused { outcome, .. } => Some(outcome),
            Clearance::Free | Clearance::Approved => None,
        }
    }
}

/// The tool calls of the conversation's last assistant message that no
/// later message answers, in the model's order. Only that message can have
/// any: every step stores its results (or the resume answers them) before
/// anything else is appended.
fn unanswered_calls(messages: &[Message]) -> Vec<(String, String, serde_json::Value)> {
    let Some(at) = messages.iter().rposition(|m| m.role == Role::Assistant) else { return Vec::new() };
    let answered: std::collections::HashSet<&str> = messages[at + 1..]
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    messages[at]
        .tool_calls()
        .filter(|(id, _, _)| !answered.contains(id))
        .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.clone()))
        .collect()
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

    #[test]
    fn a_final_answer_without_tool_calls_finishes_the_run() {
        let answer = Message { role: Role::Assistant, parts: vec![Part::Text { text: "done".into() }] };
        assert_eq!(finished(&[answer]), Some(Outcome::Succeeded { summary: "done".into() }));
        let call = Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall { id: "1".into(), name: "bash".into(), arguments: serde_json::json!({}) }],
        };
        assert_eq!(finished(&[call]), None);
        assert_eq!(finished(&[Message::user("hi")]), None);
    }

    #[test]
    fn only_the_last_assistant_messages_calls_without_results_are_unanswered() {
        let call = |id: &str| Part::ToolCall { id: id.into(), name: "bash".into(), arguments: serde_json::json!({}) };
        let result = |id: &str| Part::ToolResult {
            call_id: id.into(),
            name: "bash".into(),
            output: "ok".into(),
            is_error: false,
        };
        let assistant = |parts| Message { role: Role::Assistant, parts };
        let tool = |parts| Message { role: Role::Tool, parts };
        let ids = |m: &[Message]| unanswered_calls(m).into_iter().map(|(id, _, _)| id).collect::<Vec<_>>();
        let answered = [Message::user("go"), assistant(vec![call("1")]), tool(vec![result("1")])];
        assert!(ids(&answered).is_empty());
        let cut = [Message::user("go"), assistant(vec![call("1"), call("2"), call("3")]), tool(vec![result("2")])];
        assert_eq!(ids(&cut), ["1", "3"]);
        assert_eq!(ids(&[Message::user("go"), assistant(vec![call("1")])]), ["1"]);
        assert!(ids(&[Message::user("go")]).is_empty());
    }
}
