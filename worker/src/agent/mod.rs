//! The agent loop: stream the model, run the tools it calls inside the
//! sandbox, persist every message, repeat until the model stops calling
//! tools or the step budget is spent.
//!
//! Messages are the durable state: a run picked up by another worker reloads
//! them and continues from the last checkpoint.

pub mod events;
mod model_call;

use std::sync::Arc;
use std::time::Instant;

use kiln_protocol::{EventBody, Message, Part, Role, Run};
use kiln_store::{Lease, Store, StoreError};

use crate::providers::{FinishReason, ModelProvider, ModelRequest, ProviderError};
use crate::sandbox::Sandbox;
use crate::tools::{Registry, ToolContext, ToolFailure};
use events::EventSink;

/// Said to the model for a call whose result was never stored because the
/// worker running it died (DESIGN.md §6): it must not be re-run blindly.
pub const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

const SYSTEM_PROMPT: &str = "You are Kiln, a coding agent working in a sandboxed Linux container. \
The repository (if any) is checked out in /workspace, which is your working directory. \
Use the tools to inspect and change files and to run commands. Work step by step; when the \
task is done, reply with a short summary of what you did and stop calling tools.";

/// How a run's loop ended, when it ended on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded { summary: String },
    Failed { error: String },
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
    pub tools: &'a Registry,
    pub events: &'a mut EventSink,
}

impl AgentRun<'_> {
    /// Drives the loop to an outcome. Store errors (including a lost lease)
    /// and sandbox failures come back as `Err`; model errors that retries
    /// could not fix become a failed outcome.
    pub async fn drive(mut self) -> Result<Outcome, AgentError> {
        let mut messages = self.resume().await?;
        let max_steps = self.run.limits.max_steps();
        let mut step = self.store.count_run_messages(self.run.id, "assistant").await? as u32;
        loop {
            if let Some(Outcome::Succeeded { summary }) = finished(&messages) {
                return Ok(Outcome::Succeeded { summary });
            }
            if step >= max_steps {
                return Ok(Outcome::Failed {
                    error: format!("reached the step limit ({max_steps}) before the task was finished"),
                });
            }
            step += 1;
            self.events.emit(EventBody::StepStarted { step }).await?;
            let request = ModelRequest {
                model: self.model.clone(),
                system: SYSTEM_PROMPT.into(),
                messages: messages.clone(),
                tools: self.tools.specs(),
                max_tokens: self.max_tokens,
                temperature: self.run.model.temperature,
            };
            let assembled = match model_call::call_model(self.provider.as_ref(), &request, self.events).await {
                Ok(a) => a,
                Err(AgentError::Provider(e)) => {
                    return Ok(Outcome::Failed { error: format!("model call failed: {e}") });
                }
                Err(e) => return Err(e),
            };
            let finish = assembled.finish_reason.clone().unwrap_or(FinishReason::EndTurn);
            self.store
                .append_message(
                    self.lease,
                    self.run.session_id,
                    &assembled.message,
                    Some(&assembled.usage),
                    Some(&self.model),
                )
                .await?;
            messages.push(assembled.message.clone());
            self.events
                .emit(EventBody::StepFinished {
                    step,
                    finish_reason: finish.as_str().to_owned(),
                    usage: assembled.usage,
                })
                .await?;

            let calls: Vec<(String, String, serde_json::Value)> = assembled
                .message
                .tool_calls()
                .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.clone()))
                .collect();
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
        }
    }

    /// Loads the conversation; on the run's first attempt adds its prompt;
    /// answers tool calls a lost worker left without results.
    async fn resume(&mut self) -> Result<Vec<Message>, AgentError> {
        let mut messages = self.store.load_messages(self.run.session_id).await?;
        if self.store.count_run_messages(self.run.id, "user").await? == 0 {
            self.persist(&mut messages, Message::user(self.run.prompt.clone())).await?;
        }
        if let Some(last) = messages.last()
            && last.role == Role::Assistant
        {
            let parts: Vec<Part> = last
                .tool_calls()
                .map(|(id, name, _)| Part::ToolResult {
                    call_id: id.to_owned(),
                    name: name.to_owned(),
                    output: INTERRUPTED.into(),
                    is_error: true,
                })
                .collect();
            if !parts.is_empty() {
                for p in &parts {
                    if let Part::ToolResult { call_id, name, output, is_error } = p {
                        self.events
                            .emit(EventBody::ToolResult {
                                call_id: call_id.clone(),
                                name: name.clone(),
                                output: output.clone(),
                                is_error: *is_error,
                                duration_ms: 0,
                            })
                            .await?;
                    }
                }
                self.persist(&mut messages, Message { role: Role::Tool, parts }).await?;
            }
        }
        Ok(messages)
    }

    /// Runs the calls one at a time, in order, emitting their events.
    async fn run_tools(&mut self, calls: Vec<(String, String, serde_json::Value)>) -> Result<Message, AgentError> {
        let ctx = ToolContext { sandbox: self.sandbox };
        let mut parts = Vec::with_capacity(calls.len());
        for (call_id, name, arguments) in calls {
            self.events
                .emit(EventBody::ToolCallReady {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                })
                .await?;
            let started = Instant::now();
            let outcome = self.tools.call(&ctx, &name, arguments).await?;
            self.events
                .emit(EventBody::ToolResult {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    output: outcome.output.clone(),
                    is_error: outcome.is_error,
                    duration_ms: started.elapsed().as_millis() as u64,
                })
                .await?;
            parts.push(Part::ToolResult { call_id, name, output: outcome.output, is_error: outcome.is_error });
        }
        Ok(Message { role: Role::Tool, parts })
    }

    async fn persist(&mut self, messages: &mut Vec<Message>, message: Message) -> Result<(), AgentError> {
        self.store.append_message(self.lease, self.run.session_id, &message, None, None).await?;
        messages.push(message);
        Ok(())
    }
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
}
