//! Plain lines for a person reading a log or a pipe: streamed text inline,
//! one line per tool call and per result, the ending and the totals in
//! words. No cursor movement, so it reads the same in a file.

use std::io::Write;

use kiln_protocol::{EventBody, TodoItem, TodoStatus};
use uuid::Uuid;

use super::phase_log::{PhaseLog, finished_line};
use super::{Render, Totals, approve_hint, mcp_origin, one_line};
use crate::client::StreamedEvent;

pub struct Printer<W: Write> {
    out: W,
    run: Uuid,
    /// Whether the cursor sits after streamed text (needs a newline first).
    mid_line: bool,
    /// Setup and maintenance output, cut into lines.
    phase_log: PhaseLog,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, run: Uuid) -> Self {
        Printer { out, run, mid_line: false, phase_log: PhaseLog::default() }
    }

    fn lines(&mut self, body: &EventBody) -> Option<Vec<String>> {
        let line = match body {
            EventBody::RunQueued { .. } => "● queued".to_owned(),
            EventBody::RunStarted { attempt, .. } => format!("● started (attempt {attempt})"),
            EventBody::SandboxReady { image, .. } => format!("● sandbox ready ({image})"),
            EventBody::EnvironmentStarted { .. }
            | EventBody::EnvironmentOutput { .. }
            | EventBody::EnvironmentFinished { .. } => return self.environment_lines(body),
            EventBody::ToolCallReady { name, arguments, .. } => {
                format!("→ {name} {}", one_line(&arguments.to_string(), 120))
            }
            EventBody::ToolResult { name, output, is_error, duration_ms, .. } => {
                let mark = if *is_error { "✗" } else { "✓" };
                format!("  {mark} {name} ({duration_ms} ms): {}", one_line(output, 160))
            }
            EventBody::ApprovalRequested { .. } | EventBody::ApprovalResolved { .. } => {
                return self.approval_lines(body);
            }
            EventBody::Todo { items } => return Some(plan(items)),
            EventBody::MessageQueued { text } => format!("» {}", one_line(text, 160)),
            EventBody::Compaction { summarized_messages, .. } => {
                format!("● compacted: {summarized_messages} older messages summarised")
            }
            EventBody::ModelRetry { error, .. } => format!("● model call failed, retrying: {error}"),
            EventBody::RunSucceeded { .. } => "● run succeeded".to_owned(),
            EventBody::RunFailed { error } => format!("● run failed: {error}"),
            EventBody::RunCancelled { reason } => format!("● run cancelled: {reason}"),
            EventBody::RunTimedOut { limit_s } => format!("● run timed out after {limit_s} s"),
            EventBody::ChangesCaptured { .. }
            | EventBody::DeliverySucceeded { .. }
            | EventBody::DeliveryFailed { .. }
            | EventBody::DeliveryRetrying { .. }
            | EventBody::CallbackSucceeded { .. }
            | EventBody::CallbackFailed { .. } => format!("● {}", super::handover::line(body)?),
            EventBody::NetworkDenied { .. } => crate::render::live::network_denied(body)?,
            EventBody::SubagentStarted { .. }
            | EventBody::SubagentEvent { .. }
            | EventBody::SubagentFinished { .. } => {
                return crate::render::subagent_lines(body);
            }
            EventBody::AttemptEvent { .. } | EventBody::AttemptFinished { .. } | EventBody::AttemptSelected { .. } => {
                return crate::render::attempts::lines(body);
            }
            _ => return None,
        };
        Some(vec![line])
    }

    /// The environment's set-up: its cache, its phases' output and ends.
    fn environment_lines(&mut self, body: &EventBody) -> Option<Vec<String>> {
        match body {
            EventBody::EnvironmentStarted { environment, hit, cache_key, .. } => {
                let how = if *hit { "hit" } else { "miss: setting up" };
                Some(vec![format!("● environment {environment} (cache {cache_key}: {how})")])
            }
            EventBody::EnvironmentOutput { phase, text } => Some(self.phase_log.output(phase, text)),
            EventBody::EnvironmentFinished { phase, exit_code, duration_ms, stored, .. } => {
                let mut lines = self.phase_log.finish();
                lines.push(format!("● {}", finished_line(phase, *exit_code, *duration_ms, *stored)));
                Some(lines)
            }
            _ => None,
        }
    }

    fn approval_lines(&self, body: &EventBody) -> Option<Vec<String>> {
        let line = match body {
            EventBody::ApprovalRequested { call_id, name, mcp_server, mcp_tool, .. } => {
                let origin = mcp_origin(mcp_server.as_deref(), mcp_tool.as_deref());
                // The call itself is the `→` line just above.
                return Some(vec![
                    format!("⏸ {name}{origin} waits for approval"),
                    format!("  {}", approve_hint(self.run, call_id)),
                ]);
            }
            EventBody::ApprovalResolved { approved, reason, .. } => match (approved, reason) {
                (true, _) => "  approved".to_owned(),
                (false, Some(reason)) => format!("  denied: {reason}"),
                (false, None) => "  denied".to_owned(),
            },
            _ => return None,
        };
        Some(vec![line])
    }

    fn write_lines(&mut self, lines: &[String]) {
        if self.mid_line {
            let _ = writeln!(self.out);
            self.mid_line = false;
        }
        for line in lines {
            let _ = writeln!(self.out, "{line}");
        }
        let _ = self.out.flush();
    }
}

/// The agent's plan, one item a line: `[x]` done, `[>]` in progress, `[ ]` pending.
pub fn plan(items: &[TodoItem]) -> Vec<String> {
    let mut lines = vec!["● plan:".to_owned()];
    lines.extend(items.iter().map(|item| {
        let mark = match item.status {
            TodoStatus::Done => "[x]",
            TodoStatus::InProgress => "[>]",
            TodoStatus::Pending => "[ ]",
        };
        format!("  {mark} {}", one_line(&item.text, 160))
    }));
    lines
}

impl<W: Write> Render for Printer<W> {
    fn event(&mut self, event: &StreamedEvent) {
        let Some(body) = event.body() else { return };
        if let EventBody::TextDelta { text } = &body {
            let _ = write!(self.out, "{text}");
            let _ = self.out.flush();
            self.mid_line = !text.ends_with('\n');
            return;
        }
        if let Some(lines) = self.lines(&body) {
            self.write_lines(&lines);
        }
    }

    fn finish(&mut self, totals: &Totals) {
        // The run's end, with its reason, is the line above.
        self.write_lines(&[format!("● {}", totals.line_without_reason())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: &str, payload: serde_json::Value) -> StreamedEvent {
        StreamedEvent { seq: 0, kind: kind.into(), payload }
    }

    #[test]
    fn printer_renders_text_inline_and_tools_as_lines() {
        let mut buf = Vec::new();
        let mut p = Printer::new(&mut buf, Uuid::nil());
        p.event(&ev("text.delta", json!({"text": "hel"})));
        p.event(&ev("text.delta", json!({"text": "lo"})));
        p.event(&ev("tool_call.ready", json!({"call_id": "c1", "name": "bash", "arguments": {"command": "ls"}})));
        p.event(&ev(
            "tool.result",
            json!({"call_id": "c1", "name": "bash", "duration_ms": 5, "output": "a\nb", "is_error": false}),
        ));
        p.event(&ev("run.succeeded", json!({"summary": "x"})));
        let out = String::from_utf8(buf).unwrap();
        assert_eq!(out, "hello\n→ bash {\"command\":\"ls\"}\n  ✓ bash (5 ms): a b\n● run succeeded\n");
    }

    #[test]
    fn approvals_show_the_command_that_decides_them_and_plans_their_items() {
        let mut buf = Vec::new();
        let run = Uuid::nil();
        let mut p = Printer::new(&mut buf, run);
        p.event(&ev(
            "approval.requested",
            json!({"call_id": "call_7", "name": "bash", "arguments": {"command": "rm x"}}),
        ));
        p.event(&ev(
            "todo",
            json!({"items": [{"text": "read", "status": "done"}, {"text": "fix", "status": "in_progress"}, {"text": "test", "status": "pending"}]}),
        ));
        let out = String::from_utf8(buf).unwrap();
        assert_eq!(
            out,
            format!(
                "⏸ bash waits for approval\n  kiln approve {run} call_7   (or --deny --reason …)\n\
                 ● plan:\n  [x] read\n  [>] fix\n  [ ] test\n"
            )
        );
    }
}
