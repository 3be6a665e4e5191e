//! Running one step's tool calls, kept out of the loop: consecutive
//! read-only calls run together, calls that change things one at a time, in
//! the model's order; each call is cleared by the approval gate first, and
//! the results come back in the model's order too. Calls past the step's
//! limit, and calls once the run's event budget is spent, are answered
//! without running (`call_limit`).

use std::time::{Duration, Instant};

use kiln_protocol::{EventBody, Message, Part, Role};
use tracing::Instrument;

use super::AgentError;
use super::approval::{Clearance, Gate};
use super::call_limit;
use super::tool_call::ToolCall;
use crate::event_sink::EventSink;
use crate::sandbox::Sandbox;
use crate::tools::{OutputStream, Registry, ToolContext, ToolFailure, ToolOutcome, todo};

/// What the tool calls of a step need.
pub(super) struct ToolRunner<'a> {
    pub gate: Gate<'a>,
    pub sandbox: &'a Sandbox,
    /// The step's tools (the same as the gate's).
    pub tools: std::sync::Arc<Registry>,
    /// Calls of one step that run (`KILN_MAX_TOOL_CALLS_PER_STEP`).
    pub max_calls: usize,
    /// What `task` calls start sub-agents with.
    pub subagents: Option<&'a dyn crate::tools::task::TaskRunner>,
}

/// What running one call came to, and how long it took.
type Ran = (Result<ToolOutcome, ToolFailure>, Duration);

impl ToolRunner<'_> {
    /// Runs `calls` batch by batch; the tool message with their results.
    /// The `tool.result` events go out with the next commit (the message's).
    pub async fn run(&self, events: &mut EventSink, calls: &[ToolCall]) -> Result<Message, AgentError> {
        let mut parts = Vec::with_capacity(calls.len());
        let (allowed, excess) = call_limit::split(calls, self.max_calls);
        for batch in batches(allowed, |call| self.tools.get(&call.name).is_some_and(|t| !t.is_mutating())) {
            if let Some(why) = events.exhausted() {
                for call in batch {
                    parts.push(report(events, call, call_limit::after_event_budget(&why), Duration::ZERO).await?);
                }
                continue;
            }
            let refusals = self.clear(events, batch).await?;
            let ran = self.execute(events, batch, refusals).await?;
            for (call, (outcome, took)) in batch.iter().zip(ran) {
                parts.push(report(events, call, outcome?, took).await?);
            }
        }
        for call in excess {
            let answer = call_limit::over_limit(calls.len(), self.max_calls);
            parts.push(report(events, call, answer, Duration::ZERO).await?);
        }
        Ok(Message { role: Role::Tool, parts })
    }

    /// Announces each call of `batch` (`tool_call.ready`, written before it
    /// runs) and takes it through the gate. For each call, the result it
    /// gets instead of running if it was refused.
    ///
    /// The batch's `tool_call.ready` events share one commit, made before
    /// any of its calls runs (the gate commits what is buffered before it
    /// asks a person about a call, so the order stays the same): a step
    /// starting four sub-agents made four commits in turn under the run's
    /// row before the first child could start.
    async fn clear(&self, events: &mut EventSink, batch: &[ToolCall]) -> Result<Vec<Option<ToolOutcome>>, AgentError> {
        let mut clearances = Vec::with_capacity(batch.len());
        for call in batch {
            events.write_soon(call.ready_event()).await?;
            clearances.push(self.gate.clear(events, call).await?);
        }
        events.commit().await?;
        self.gate.release(batch, &clearances).await?;
        Ok(clearances.into_iter().map(Clearance::refusal).collect())
    }

    /// Runs the calls of `batch` at once (a refused call gets its refusal);
    /// streamed command output becomes `tool.output` events meanwhile.
    async fn execute(
        &self,
        events: &mut EventSink,
        batch: &[ToolCall],
        refusals: Vec<Option<ToolOutcome>>,
    ) -> Result<Vec<Ran>, AgentError> {
        let stream = OutputStream::default();
        let work = futures::future::join_all(batch.iter().zip(refusals).map(|(call, refusal)| {
            let ctx = ToolContext {
                sandbox: self.sandbox,
                output: Some(stream.sink(&call.id)),
                call_id: &call.id,
                subagents: self.subagents,
            };
            self.execute_one(ctx, call, refusal)
        }));
        Ok(stream.forward(work, events).await?)
    }

    /// One call in its `tool_call` span, timed and counted.
    async fn execute_one(&self, ctx: ToolContext<'_>, call: &ToolCall, refusal: Option<ToolOutcome>) -> Ran {
        // Labels only for tools that exist: the model can make up names.
        let label = if self.tools.get(&call.name).is_some() { call.name.clone() } else { "unknown".to_owned() };
        let span = tracing::info_span!(
            "tool_call",
            tool = %label,
            call_id = %call.id,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        async move {
            let started = Instant::now();
            let refused = refusal.is_some();
            let outcome = match refusal {
                // Refused before it ran (not allowed, or denied).
                Some(refusal) => Ok(refusal),
                None => self.tools.call(&ctx, &call.name, call.arguments.clone()).await,
            };
            let took = started.elapsed();
            let result = match &outcome {
                Err(_) => "failure",
                Ok(_) if refused => "refused",
                Ok(o) if o.is_error => "error",
                Ok(_) => "ok",
            };
            tracing::Span::current().record("outcome", result).record("duration_ms", took.as_millis() as u64);
            crate::metrics::tool_call(label, result, took);
            (outcome, took)
        }
        .instrument(span)
        .await
    }
}

/// Splits `calls` into the batches that run together: each run of
/// consecutive read-only calls is one, every other call is one of its own.
fn batches(calls: &[ToolCall], read_only: impl Fn(&ToolCall) -> bool) -> Vec<&[ToolCall]> {
    let mut batches = Vec::new();
    let mut rest = calls;
    while let Some(first) = rest.first() {
        let len = if read_only(first) { rest.iter().take_while(|c| read_only(c)).count() } else { 1 };
        let (batch, tail) = rest.split_at(len);
        batches.push(batch);
        rest = tail;
    }
    batches
}

/// Announces what a call came to (its `todo` list first, when it set one)
/// and returns its answer for the tool message. The events go out with the
/// next commit: the tool message's, or within the coalescing window.
async fn report(
    events: &mut EventSink,
    call: &ToolCall,
    outcome: ToolOutcome,
    took: Duration,
) -> Result<Part, AgentError> {
    if call.name == todo::NAME
        && !outcome.is_error
        && let Ok(items) = todo::items(&call.arguments)
    {
        events.write_soon(EventBody::Todo { items }).await?;
    }
    events.write_soon(call.result_event(&outcome, took)).await?;
    Ok(call.result_part(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn read_only_calls_in_a_row_share_a_batch_and_others_run_alone() {
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: json!({}),
            provider_id: None,
        };
        let calls = [call("1", "view"), call("2", "grep"), call("3", "bash"), call("4", "edit"), call("5", "view")];
        let got: Vec<Vec<&str>> = batches(&calls, |c| c.name == "view" || c.name == "grep")
            .into_iter()
            .map(|batch| batch.iter().map(|c| c.id.as_str()).collect())
            .collect();
        assert_eq!(got, [vec!["1", "2"], vec!["3"], vec!["4"], vec!["5"]]);
        assert!(batches(&[], |_| true).is_empty());
    }
}
