//! The live progress display on a terminal: a spinner line at the bottom
//! with the current step and what is happening in it (the model's text as
//! it streams, the running command's latest output), and above it what is
//! done: the model's text line by line, one line per tool call with its
//! duration, approvals with the command that decides them, the plan; the
//! totals at the end.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use console::style;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_protocol::EventBody;
use uuid::Uuid;

use super::phase_log::{PhaseLog, finished_line};
use super::plain::plan;
use super::{Outcome, Render, Totals, approve_hint, call_summary, mcp_origin, one_line};
use crate::client::StreamedEvent;

const TICK: Duration = Duration::from_millis(100);

pub struct Live {
    bar: ProgressBar,
    run: Uuid,
    /// The model's text since the last newline: shown on the spinner line
    /// until its line is complete, then printed above.
    partial: String,
    /// What each pending call is, from `tool_call.ready`, for its result's line.
    calls: HashMap<String, String>,
    /// Setup and maintenance output, printed above as lines complete.
    phase_log: PhaseLog,
}

impl Live {
    pub fn new(run: Uuid) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
        // The template is a constant; should it not parse, the default spinner style stays.
        if let Ok(style) = ProgressStyle::with_template("{spinner:.cyan} {prefix:.bold} {msg}") {
            bar.set_style(style.tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "));
        }
        bar.set_prefix("run");
        bar.set_message("connecting…");
        bar.enable_steady_tick(TICK);
        Live { bar, run, partial: String::new(), calls: HashMap::new(), phase_log: PhaseLog::default() }
    }

    /// Room for the spinner line's message, so it never wraps (a wrapped
    /// line would leave copies of itself behind on every redraw).
    fn room(&self) -> usize {
        let (_, cols) = console::Term::stdout().size();
        usize::from(cols).saturating_sub(self.bar.prefix().chars().count() + 4).max(10)
    }

    fn activity(&self, what: &str) {
        self.bar.set_message(one_line(what, self.room()));
    }

    /// Prints lines above the spinner, after any streamed text still pending.
    fn print(&mut self, lines: &[String]) {
        self.flush_text();
        for line in lines {
            self.bar.println(line);
        }
    }

    fn flush_text(&mut self) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.bar.println(line);
        }
    }

    fn text(&mut self, text: &str) {
        self.partial.push_str(text);
        while let Some(newline) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=newline).collect();
            self.bar.println(line.trim_end_matches(['\n', '\r']));
        }
        // The tail of the line being written, so the newest words are in view.
        let room = self.room();
        let chars = self.partial.chars().count();
        let tail: String = self.partial.chars().skip(chars.saturating_sub(room)).collect();
        self.bar.set_message(tail);
    }

    fn result_line(&mut self, call_id: &str, name: &str, output: &str, is_error: bool, duration_ms: u64) -> String {
        let what = self.calls.remove(call_id).unwrap_or_default();
        let mark = if is_error { style("✗").red().to_string() } else { style("✓").green().to_string() };
        let took = style(format!("{duration_ms} ms")).dim();
        let mut line = format!("{mark} {} {what} · {took}", style(name).bold());
        if is_error {
            line.push_str(&format!(" — {}", error_gist(output)));
        }
        line
    }
}

/// Why a call failed, in one line: the last thing it said (where errors
/// go), with the `[exit code N]` the bash tool ends with.
fn error_gist(output: &str) -> String {
    let mut lines = output.lines().map(str::trim).filter(|l| !l.is_empty()).rev();
    let gist = match lines.next() {
        Some(code) if code.starts_with("[exit code") => match lines.next() {
            Some(said) => format!("{said} {code}"),
            None => code.to_owned(),
        },
        Some(said) => said.to_owned(),
        None => String::new(),
    };
    one_line(&gist, 120)
}

/// A refusal by the egress proxy, in one line (shared with the plain printer).
pub fn network_denied(body: &EventBody) -> Option<String> {
    let EventBody::NetworkDenied { host, port, method, layer, rule, suppressed } = body else { return None };
    let method = method.as_deref().map(|m| format!("{m} ")).unwrap_or_default();
    let more = if *suppressed > 0 { format!(" (+{suppressed} more not shown)") } else { String::new() };
    Some(one_line(&format!("network denied: {method}{host}:{port} by the {layer} policy: {rule}{more}"), 200))
}

impl Render for Live {
    fn event(&mut self, event: &StreamedEvent) {
        let Some(body) = event.body() else { return };
        match body {
            EventBody::RunQueued { .. }
            | EventBody::RunStarted { .. }
            | EventBody::SandboxReady { .. }
            | EventBody::EnvironmentStarted { .. }
            | EventBody::EnvironmentOutput { .. }
            | EventBody::EnvironmentFinished { .. } => self.setting_up(body),
            EventBody::StepStarted { .. }
            | EventBody::TextDelta { .. }
            | EventBody::ReasoningDelta { .. }
            | EventBody::ToolCallStarted { .. }
            | EventBody::ToolCallReady { .. }
            | EventBody::ToolOutput { .. }
            | EventBody::ToolResult { .. }
            | EventBody::ModelRetry { .. }
            | EventBody::StepFinished { .. } => self.stepping(body),
            EventBody::ApprovalRequested { .. }
            | EventBody::ApprovalResolved { .. }
            | EventBody::Todo { .. }
            | EventBody::MessageQueued { .. }
            | EventBody::Compaction { .. } => self.conversing(body),
            EventBody::DeliverySucceeded { .. }
            | EventBody::DeliveryFailed { .. }
            | EventBody::DeliveryRetrying { .. }
            | EventBody::CallbackSucceeded { .. }
            | EventBody::CallbackFailed { .. }
            | EventBody::ChangesCaptured { .. } => self.handing_over(body),
            EventBody::RunSucceeded { .. }
            | EventBody::RunFailed { .. }
            | EventBody::RunCancelled { .. }
            | EventBody::RunTimedOut { .. } => self.flush_text(),
            EventBody::NetworkDenied { .. } => {
                if let Some(line) = network_denied(&body) {
                    self.print(&[format!("{} {line}", style("⛔").red())]);
                }
            }
            EventBody::SubagentStarted { .. }
            | EventBody::SubagentEvent { .. }
            | EventBody::SubagentFinished { .. } => {
                if let Some(lines) = super::subagent_lines(&body) {
                    self.print(&lines);
                }
            }
            EventBody::AttemptEvent { .. } | EventBody::AttemptFinished { .. } | EventBody::AttemptSelected { .. } => {
                if let Some(lines) = super::attempts::lines(&body) {
                    self.print(&lines);
                }
            }
            EventBody::ToolCallDelta { .. } | EventBody::NetworkAllowed { .. } => {}
        }
    }

    fn finish(&mut self, totals: &Totals) {
        self.flush_text();
        self.bar.finish_and_clear();
        let mark = match &totals.outcome {
            Some(Outcome::Succeeded) => style("✓").green(),
            Some(_) => style("✗").red(),
            None => style("●").yellow(),
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{mark} {}", style(totals.line()).bold());
        let _ = out.flush();
    }
}

impl Drop for Live {
    /// An error or Ctrl-C mid-run must not leave a spinner line behind.
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

impl Live {
    /// The run's start: queued, started, its sandbox and environment.
    fn setting_up(&mut self, body: EventBody) {
        match body {
            EventBody::RunQueued { .. } => self.activity("queued"),
            EventBody::RunStarted { attempt, .. } if attempt > 1 => {
                self.print(&[format!("{} resumed (attempt {attempt})", style("●").yellow())]);
                self.activity("starting");
            }
            EventBody::RunStarted { .. } => self.activity("starting"),
            EventBody::SandboxReady { .. } => self.activity("sandbox ready"),
            EventBody::EnvironmentStarted { environment, hit, .. } => {
                let how = if hit { "prepared sandbox from the cache" } else { "setting up" };
                self.print(&[format!("{} environment {environment}: {how}", style("●").dim())]);
                self.activity(if hit { "maintenance…" } else { "setup…" });
            }
            EventBody::EnvironmentOutput { phase, text } => {
                let lines = self.phase_log.output(&phase, &text);
                self.print(&lines);
            }
            EventBody::EnvironmentFinished { phase, exit_code, duration_ms, stored, .. } => {
                let mut lines = self.phase_log.finish();
                lines.push(format!("{} {}", style("●").dim(), finished_line(&phase, exit_code, duration_ms, stored)));
                self.print(&lines);
            }
            _ => {}
        }
    }

    /// A step: the model's text, its tool calls and their results.
    fn stepping(&mut self, body: EventBody) {
        match body {
            EventBody::StepStarted { step } => {
                self.flush_text();
                self.bar.set_prefix(format!("step {step}"));
                self.activity("thinking…");
            }
            EventBody::TextDelta { text } => self.text(&text),
            EventBody::ReasoningDelta { .. } => self.activity("reasoning…"),
            EventBody::ToolCallStarted { name, .. } => {
                self.flush_text();
                self.activity(&format!("{name}…"));
            }
            EventBody::ToolCallReady { call_id, name, arguments } => {
                let what = call_summary(&name, &arguments);
                self.activity(&format!("{name} {what}"));
                self.calls.insert(call_id, what);
            }
            EventBody::ToolOutput { text, .. } => {
                if let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) {
                    self.activity(&format!("│ {last}"));
                }
            }
            EventBody::ToolResult { call_id, name, output, is_error, duration_ms } => {
                let line = self.result_line(&call_id, &name, &output, is_error, duration_ms);
                self.print(&[line]);
                self.activity("thinking…");
            }
            EventBody::ModelRetry { error, delay_ms, .. } => {
                self.activity(&format!("model call failed, retrying in {delay_ms} ms: {error}"));
            }
            EventBody::StepFinished { .. } => self.flush_text(),
            _ => {}
        }
    }

    /// What a person takes part in: approvals, the plan, messages, compaction.
    fn conversing(&mut self, body: EventBody) {
        match body {
            EventBody::ApprovalRequested { call_id, name, arguments, mcp_server, mcp_tool } => {
                let what = call_summary(&name, &arguments);
                let origin = mcp_origin(mcp_server.as_deref(), mcp_tool.as_deref());
                self.print(&[
                    format!("{} {}{origin} {what} waits for approval", style("⏸").yellow(), style(&name).bold()),
                    format!("  {}", style(approve_hint(self.run, &call_id)).cyan()),
                ]);
                self.activity("waiting for approval");
            }
            EventBody::ApprovalResolved { approved, reason, .. } => {
                let line = match (approved, reason) {
                    (true, _) => "  approved".to_owned(),
                    (false, Some(reason)) => format!("  denied: {reason}"),
                    (false, None) => "  denied".to_owned(),
                };
                self.print(&[line]);
            }
            EventBody::Todo { items } => self.print(&plan(&items)),
            EventBody::MessageQueued { text } => self.print(&[format!("» {}", one_line(&text, 160))]),
            EventBody::Compaction { summarized_messages, .. } => {
                self.print(&[format!("● compacted: {summarized_messages} older messages summarised")]);
            }
            _ => {}
        }
    }

    /// The change captured and where it went: deliveries and callbacks.
    fn handing_over(&mut self, body: EventBody) {
        let mark = match body {
            EventBody::ChangesCaptured { too_large: true, .. } => style("●").yellow(),
            EventBody::ChangesCaptured { .. } => style("●").dim(),
            _ => style("●"),
        };
        if let Some(line) = super::handover::line(&body) {
            self.print(&[format!("{mark} {line}")]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_is_summed_up_by_its_last_words_and_exit_code() {
        let output =
            "total 8\ndrwxr-xr-x 2 kiln kiln 4096 .\ncat: README.md: No such file or directory\n[exit code 1]\n";
        assert_eq!(error_gist(output), "cat: README.md: No such file or directory [exit code 1]");
        assert_eq!(error_gist("no such file: a.rs"), "no such file: a.rs");
        assert_eq!(error_gist("[exit code 2]"), "[exit code 2]");
    }
}
