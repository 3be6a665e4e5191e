//! How the terminal client shows a run's events: a live progress display on
//! a terminal ([`live`]), plain lines otherwise ([`plain`]), or the events
//! themselves as JSON lines for scripts ([`json`]). All three see the same
//! events; [`totals`] adds them up for the closing line. What a person
//! sees is [`printable`]: no terminal escapes from the server get through.

pub mod attempts;
pub mod diffstat;
pub mod handover;
pub mod json;
pub mod live;
pub mod phase_log;
pub mod plain;
pub mod printable;
pub mod totals;

use std::io::IsTerminal;

use uuid::Uuid;

use crate::client::StreamedEvent;
pub use totals::{Outcome, Totals};

/// Shows one run's events as they come.
pub trait Render {
    fn event(&mut self, event: &StreamedEvent);

    /// The events are over (the run ended, or they were all read);
    /// `totals` adds them up.
    fn finish(&mut self, totals: &Totals);
}

/// Which display a command uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Live,
    Plain,
    Json,
}

impl Mode {
    /// `--json` wins; otherwise live on a terminal, plain lines elsewhere.
    pub fn choose(json: bool) -> Mode {
        if json {
            Mode::Json
        } else if std::io::stdout().is_terminal() {
            Mode::Live
        } else {
            Mode::Plain
        }
    }

    /// The renderer for run `run`, writing to stdout.
    pub fn renderer(self, run: Uuid) -> Box<dyn Render> {
        match self {
            Mode::Live => Box::new(live::Live::new(run)),
            Mode::Plain => Box::new(plain::Printer::new(std::io::stdout(), run)),
            Mode::Json => Box::new(json::JsonLines::new(std::io::stdout())),
        }
    }
}

/// What a person needs to read a tool call at a glance: the command for
/// `bash`, the path for the file tools, the arguments otherwise.
pub fn call_summary(name: &str, arguments: &serde_json::Value) -> String {
    if name == "todo"
        && let Some(items) = arguments.get("items").and_then(|v| v.as_array())
    {
        // The plan itself is printed from its `todo` event.
        return if items.len() == 1 { "1 item".to_owned() } else { format!("{} items", items.len()) };
    }
    let field = match name {
        "bash" => "command",
        "view" | "write" | "edit" | "ls" => "path",
        "glob" | "grep" => "pattern",
        _ => "",
    };
    match arguments.get(field).and_then(|v| v.as_str()) {
        Some(s) => one_line(s, 100),
        None => one_line(&arguments.to_string(), 100),
    }
}

/// `s` on one line (whitespace runs become one space), at most `max`
/// characters, with an ellipsis when cut.
pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max { format!("{}…", flat.chars().take(max).collect::<String>()) } else { flat }
}

/// A sub-agent's event in its parent's stream, as the lines printed for it,
/// indented under the parent's (by its depth in the tree): its start, each
/// tool call's result, and its end with what it spent. `None` for the
/// other events of a child (its steps) and for events of no sub-agent.
pub fn subagent_lines(body: &kiln_protocol::EventBody) -> Option<Vec<String>> {
    use kiln_protocol::EventBody;
    let indent = |path: &str| "  ".repeat(path.matches('/').count());
    match body {
        EventBody::SubagentStarted { agent_path, agent, description, run_id, taken_over, .. } => {
            let again = if *taken_over { " (continued after a lost worker)" } else { "" };
            Some(vec![format!(
                "{}↳ {agent} sub-agent {}{again}: {} [run {run_id}]",
                indent(agent_path),
                agent_path,
                one_line(description, 100)
            )])
        }
        EventBody::SubagentEvent { agent_path, event, .. } => {
            let payload = &event["payload"];
            match event["kind"].as_str()? {
                "tool.result" => {
                    let mark = if payload["is_error"].as_bool() == Some(true) { "✗" } else { "✓" };
                    let name = payload["name"].as_str().unwrap_or("?");
                    let ms = payload["duration_ms"].as_u64().unwrap_or(0);
                    let output = one_line(payload["output"].as_str().unwrap_or(""), 100);
                    Some(vec![format!("{}  {mark} {name} ({ms} ms): {output}", indent(agent_path))])
                }
                _ => None,
            }
        }
        EventBody::SubagentFinished { agent_path, status, summary, usage, steps, .. } => {
            let tokens = usage.input_tokens + usage.output_tokens;
            Some(vec![format!(
                "{}↳ {agent_path} {status} after {steps} steps, {tokens} tokens: {}",
                indent(agent_path),
                one_line(summary, 120)
            )])
        }
        _ => None,
    }
}

/// Whose tool a call waiting for approval is, for an MCP tool: ` (tool
/// "create_issue" of the MCP server "github")`; empty for built-in tools
/// (and events from servers before these fields).
pub fn mcp_origin(server: Option<&str>, tool: Option<&str>) -> String {
    match (server, tool) {
        (Some(server), Some(tool)) => format!(" (tool {:?} of the MCP server {server:?})", one_line(tool, 80)),
        (Some(server), None) => format!(" (of the MCP server {server:?})"),
        _ => String::new(),
    }
}

/// The commands that decide a waiting call, as printed beside it.
pub fn approve_hint(run: Uuid, call_id: &str) -> String {
    format!("{} approve {run} {call_id}   (or --deny --reason …)", crate::invocation::kiln())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_mcp_tools_server_is_named_apart_from_the_tool() {
        assert_eq!(
            mcp_origin(Some("github"), Some("create_issue")),
            " (tool \"create_issue\" of the MCP server \"github\")"
        );
        assert_eq!(mcp_origin(None, None), "");
    }

    #[test]
    fn calls_are_summarised_by_what_matters_most() {
        assert_eq!(call_summary("bash", &json!({"command": "ls -la\n  && pwd"})), "ls -la && pwd");
        assert_eq!(call_summary("edit", &json!({"path": "a.rs", "old_string": "x"})), "a.rs");
        assert_eq!(call_summary("todo", &json!({"items": [{"text": "a"}, {"text": "b"}]})), "2 items");
        assert_eq!(call_summary("mcp_tool", &json!({"q": 1})), r#"{"q":1}"#);
        assert_eq!(one_line(&"a".repeat(5), 3), "aaa…");
    }

    #[test]
    fn a_sub_agents_lines_are_indented_under_its_parent() {
        use kiln_protocol::{EventBody, Usage};
        let run_id = Uuid::nil();
        let path = "main/explore[1-1]".to_owned();
        let started = EventBody::SubagentStarted {
            call_id: "1-1".into(),
            run_id,
            agent_path: path.clone(),
            agent: "explore".into(),
            description: "find the parser".into(),
            taken_over: false,
        };
        let line = &subagent_lines(&started).unwrap()[0];
        assert!(line.starts_with("  ↳ explore sub-agent main/explore[1-1]: find the parser"), "{line}");
        let result = EventBody::SubagentEvent {
            call_id: "1-1".into(),
            run_id,
            agent_path: path.clone(),
            seq: 7,
            event: json!({"kind": "tool.result", "payload": {"name": "grep", "output": "a.rs:1", "is_error": false, "duration_ms": 3}}),
        };
        assert_eq!(subagent_lines(&result).unwrap(), ["    ✓ grep (3 ms): a.rs:1"]);
        let step = EventBody::SubagentEvent {
            call_id: "1-1".into(),
            run_id,
            agent_path: path.clone(),
            seq: 8,
            event: json!({"kind": "step.started", "payload": {"step": 2}}),
        };
        assert_eq!(subagent_lines(&step), None);
        let usage = Usage { input_tokens: 10, output_tokens: 2, ..Usage::default() };
        let done = EventBody::SubagentFinished {
            call_id: "1-1".into(),
            run_id,
            agent_path: path,
            status: "succeeded".into(),
            summary: "in src/parse.rs".into(),
            usage,
            cost_usd: None,
            steps: 2,
        };
        assert_eq!(
            subagent_lines(&done).unwrap(),
            ["  ↳ main/explore[1-1] succeeded after 2 steps, 12 tokens: in src/parse.rs"]
        );
    }
}
