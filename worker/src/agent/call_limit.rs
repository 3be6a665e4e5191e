//! Which of a step's tool calls run.
//!
//! One model message can ask for any number of calls (a provider's stream
//! is as hostile as the sandbox), and each one runs in the sandbox and
//! stores events. The first `max` run; the rest are answered with an error
//! saying why, without running: the provider wants an answer for every
//! call, and the model can make them again in its next step. Once the run's
//! event budget is spent no call runs: nothing could record what it did.

use super::tool_call::ToolCall;
use crate::tools::ToolOutcome;

/// The setting that sets the limit, named in the answers.
pub const SETTING: &str = "KILN_MAX_TOOL_CALLS_PER_STEP";

/// `calls` split into those that run and those past the limit.
pub(super) fn split(calls: &[ToolCall], max: usize) -> (&[ToolCall], &[ToolCall]) {
    calls.split_at(calls.len().min(max))
}

/// The answer to a call past the limit, in a step of `total` calls.
pub(super) fn over_limit(total: usize, max: usize) -> ToolOutcome {
    ToolOutcome::error(format!(
        "not run: this step made {total} tool calls, and at most {max} tool calls run per step (the worker's \
         {SETTING}). Make the calls that did not run again, in fewer calls per step."
    ))
}

/// The answer to a call made after the run's event budget ran out.
pub(super) fn after_event_budget(why: &str) -> ToolOutcome {
    ToolOutcome::error(format!("not run: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_calls_run_and_the_rest_are_answered_naming_the_limit() {
        let calls: Vec<ToolCall> = (0..5)
            .map(|i| ToolCall { id: i.to_string(), name: "bash".into(), arguments: json!({}), provider_id: None })
            .collect();
        let (run, rest) = split(&calls, 3);
        assert_eq!((run.len(), rest.len()), (3, 2));
        assert_eq!(rest[0].id, "3");
        assert_eq!(split(&calls, 64).1.len(), 0);
        let answer = over_limit(5, 3);
        assert!(answer.is_error && answer.output.contains("at most 3 tool calls") && answer.output.contains(SETTING));
    }
}
