//! Picking a run up: the conversation is reloaded from the database, and
//! the tool calls left without results are answered before anything else
//! joins it (the providers refuse a call without its result).
//!
//! A call whose result was never stored is not run again blindly: the
//! worker running it may have died after it took effect. The exception is
//! a call that had to wait for a person and was never let through: it
//! certainly did not run, so it goes through the gate again (a decision
//! already made stands) and runs if approved. See "Resume after a lost
//! worker" in `docs/architecture.md` (§6).

use std::collections::{HashMap, HashSet};

use kiln_protocol::{EventBody, Message, Part, Role};

use super::tool_call::ToolCall;
use super::{AgentError, AgentRun};
use crate::db_retry::with_retry;
use crate::event_sink::NewMessage;
use crate::tools::{ToolOutcome, task};

/// Said to the model for a call whose result was never stored because the
/// worker running it died: it must not be re-run blindly.
pub const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

/// Said to the model, in a follow-up, for a call of the earlier run that was
/// still running when that run ended: its result was never stored.
pub const ENDED_MID_CALL: &str = "interrupted: the run ended (cancelled, timed out or failed) while this call was \
     running; it may or may not have completed";

impl AgentRun<'_> {
    /// Loads the conversation; answers the tool calls left without results;
    /// on the run's first attempt adds its prompt.
    ///
    /// The answers go first: a follow-up to a run cancelled mid-call would
    /// otherwise put its prompt between the call and its answer.
    pub(super) async fn resume(&mut self) -> Result<Vec<Message>, AgentError> {
        // A sub-agent's conversation is its own, not the session's.
        // A run's first attempt has stored nothing of its own yet (attempts
        // only count up): a new sub-agent's conversation is empty, and no
        // count is needed to know it is the first. Saves a new child two
        // queries before its first model call.
        let fresh = self.lease.attempt == 1;
        let mut messages = match self.run.parent_run_id {
            Some(_) if fresh => Vec::new(),
            Some(_) => with_retry(|| self.store.load_child_messages(self.run.id)).await?,
            None => with_retry(|| self.store.load_messages(self.run.session_id)).await?,
        };
        let first_attempt = fresh || with_retry(|| self.store.count_run_messages(self.run.id, "user")).await? == 0;
        let unanswered = unanswered_calls(&messages);
        if !unanswered.is_empty() {
            let (answers, events) = self.answer(unanswered, first_attempt).await?;
            // Announced in the tool message's commit: a repeated takeover
            // cannot repeat the events without the message.
            self.events.write_message(NewMessage::plain(self.run.session_id, answers.clone()), events).await?;
            messages.push(answers);
        }
        if first_attempt {
            self.persist(&mut messages, Message::user(self.run.prompt.clone())).await?;
        }
        Ok(messages)
    }

    /// The tool message answering `unanswered`, and the `tool.result` events
    /// of the calls that did not run now. On a run's first attempt the
    /// calls are an earlier run's, which ended (cancelled, timed out,
    /// failed) while they ran: none of them runs now.
    async fn answer(
        &mut self,
        unanswered: Vec<ToolCall>,
        first_attempt: bool,
    ) -> Result<(Message, Vec<EventBody>), AgentError> {
        let mut rerun = if first_attempt { Vec::new() } else { self.never_let_through(&unanswered).await? };
        // A `task` call is continued, not lost: its child's row and
        // conversation are stored, and running the call again takes the
        // child over (or returns the answer it already gave).
        if !first_attempt {
            let tasks = unanswered.iter().filter(|c| c.name == task::NAME && !rerun.iter().any(|r| r.id == c.id));
            rerun.extend(tasks.cloned().collect::<Vec<_>>());
        }
        let budget = self.budget_so_far().await?;
        let host = self.step_host(&budget, &rerun);
        let mut ran: HashMap<String, Part> = HashMap::new();
        if !rerun.is_empty() {
            // The children's spending is in the store: the budget the loop
            // reads after this counts it.
            for part in self.tool_runner_with(host.as_deref()).run(self.events, &rerun).await?.parts {
                if let Part::ToolResult { call_id, .. } = &part {
                    ran.insert(call_id.clone(), part);
                }
            }
        }
        let lost = ToolOutcome::error(if first_attempt { ENDED_MID_CALL } else { INTERRUPTED });
        let mut events = Vec::new();
        let mut parts = Vec::with_capacity(unanswered.len());
        for call in unanswered {
            if let Some(part) = ran.remove(&call.id) {
                parts.push(part);
                continue;
            }
            events.push(call.result_event(&lost, std::time::Duration::ZERO));
            parts.push(call.result_part(lost.clone()));
        }
        Ok((Message { role: Role::Tool, parts }, events))
    }

    /// The calls of `unanswered` that had to wait for a person and were
    /// never marked as started: they certainly did not run.
    async fn never_let_through(&self, unanswered: &[ToolCall]) -> Result<Vec<ToolCall>, AgentError> {
        let started = with_retry(|| self.store.started_approved_calls(self.run.id)).await?;
        let gate = self.gate();
        Ok(unanswered
            .iter()
            .filter(|call| (!gate.allows(&call.name) || gate.needs_approval(&call.name)) && !started.contains(&call.id))
            .cloned()
            .collect())
    }
}

/// The tool calls of the conversation's last assistant message that no
/// later message answers, in the model's order. Only that message can have
/// any: every step stores its results (or the resume answers them) before
/// anything else is appended.
fn unanswered_calls(messages: &[Message]) -> Vec<ToolCall> {
    let Some(at) = messages.iter().rposition(|m| m.role == Role::Assistant) else { return Vec::new() };
    let answered: HashSet<&str> = messages[at + 1..]
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    ToolCall::all_in(&messages[at]).into_iter().filter(|call| !answered.contains(call.id.as_str())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_assistant_messages_calls_without_results_are_unanswered() {
        let call = |id: &str| Part::ToolCall {
            id: id.into(),
            name: "bash".into(),
            arguments: serde_json::json!({}),
            provider_id: None,
        };
        let result = |id: &str| Part::ToolResult {
            call_id: id.into(),
            name: "bash".into(),
            output: "ok".into(),
            is_error: false,
            provider_call_id: None,
        };
        let assistant = |parts| Message { role: Role::Assistant, parts };
        let tool = |parts| Message { role: Role::Tool, parts };
        let ids = |m: &[Message]| unanswered_calls(m).into_iter().map(|call| call.id).collect::<Vec<_>>();
        let answered = [Message::user("go"), assistant(vec![call("1")]), tool(vec![result("1")])];
        assert!(ids(&answered).is_empty());
        let cut = [Message::user("go"), assistant(vec![call("1"), call("2"), call("3")]), tool(vec![result("2")])];
        assert_eq!(ids(&cut), ["1", "3"]);
        assert_eq!(ids(&[Message::user("go"), assistant(vec![call("1")])]), ["1"]);
        assert!(ids(&[Message::user("go")]).is_empty());
    }
}
