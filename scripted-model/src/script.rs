//! What the scripted model says: one [`Reply`] per request, in order.

use serde_json::{Value, json};

/// The model's answer to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// Text streamed before any tool calls.
    pub text: Option<String>,
    /// Tool calls, streamed after the text in this order.
    pub tool_calls: Vec<ScriptedCall>,
    /// Stream the start of the answer and one text delta, then nothing,
    /// ever: for cancellation and timeout tests.
    pub hang: bool,
    /// Answer with this HTTP error status (and the API's error body)
    /// instead of a stream.
    pub status: Option<u16>,
    /// Close the stream in the middle of the first tool call's arguments,
    /// with no finish event: a connection lost mid-answer.
    pub cut: bool,
    /// Input tokens reported as read from the provider's prompt cache, on
    /// top of the uncached estimate (each wire format in its own way).
    pub cached_input: u64,
    /// Send exactly this text as the response body (a recorded stream),
    /// whatever the request; everything else above is ignored.
    pub raw: Option<String>,
    /// Wait this long before the first byte of the answer: a model that
    /// takes its time (for tests of overlap and benchmarks of parallelism).
    pub delay: Option<std::time::Duration>,
    /// Report exactly these (input, output) tokens instead of the estimate.
    pub usage: Option<(u64, u64)>,
}

/// One tool call the model makes.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedCall {
    pub name: String,
    pub arguments: Value,
    /// The call's id on the wire; `None`: a fresh one (`call_N`, `toolu_N`).
    /// Set it to play a server that reuses ids (`call_0` every step, or the
    /// same id twice in one answer).
    pub id: Option<String>,
}

impl ScriptedCall {
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        ScriptedCall { name: name.into(), arguments, id: None }
    }

    /// The same call, sent under `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}

impl Reply {
    /// A final answer: text and end of turn.
    pub fn text(text: impl Into<String>) -> Self {
        Reply { text: Some(text.into()), ..Reply::default() }
    }

    /// One tool call.
    pub fn tool(name: impl Into<String>, arguments: Value) -> Self {
        Reply::tools(vec![ScriptedCall::new(name, arguments)])
    }

    /// Several tool calls in one answer (parallel tool use).
    pub fn tools(calls: Vec<ScriptedCall>) -> Self {
        Reply { tool_calls: calls, ..Reply::default() }
    }

    /// An answer that starts and never finishes.
    pub fn hang() -> Self {
        Reply { hang: true, ..Reply::default() }
    }

    /// One tool call whose stream breaks off inside its arguments.
    pub fn cut_mid_tool(name: impl Into<String>, arguments: Value) -> Self {
        Reply { cut: true, ..Reply::tool(name, arguments) }
    }

    /// An HTTP error (429, 500, 529, …) instead of an answer.
    pub fn error(status: u16) -> Self {
        Reply { status: Some(status), ..Reply::default() }
    }

    /// A recorded answer, replayed byte for byte.
    pub fn raw(body: impl Into<String>) -> Self {
        Reply { raw: Some(body.into()), ..Reply::default() }
    }

    /// Report `tokens` of the input as served from the prompt cache.
    pub fn with_cached_input(mut self, tokens: u64) -> Self {
        self.cached_input = tokens;
        self
    }

    /// The same answer, sent after `delay`.
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The same answer, reporting `input` and `output` tokens.
    pub fn with_usage(mut self, input: u64, output: u64) -> Self {
        self.usage = Some((input, output));
        self
    }

    /// Adds text said before the tool calls.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }
}

/// What the model says once the script has run out, so a run that asks
/// for more than was scripted still ends instead of failing.
pub const EXHAUSTED_TEXT: &str = "scripted model: script exhausted";

pub(crate) fn exhausted() -> Reply {
    Reply::text(EXHAUSTED_TEXT)
}

const DEMO_NOTES: &str = "# Notes\n\n\
This file was written by the scripted demo model of `kiln up --demo`.\n\n\
It shows one agent loop end to end: the model looked around the workspace,\n\
wrote this file, edited it, read it back, and then finished its turn.\n\
Every step was a real tool call run inside the run's sandbox container.\n";

/// The script of `kiln up --demo`: look around, write a file, edit it, read
/// it back, summarise. Uses only the built-in tools (`bash`, `write`,
/// `edit`, `view`) with their real argument names.
pub fn demo_script() -> Vec<Reply> {
    vec![
        Reply::tool("bash", json!({"command": "ls -la && cat README.md"}))
            .with_text("Let me look at the workspace first."),
        Reply::tool("write", json!({"path": "NOTES.md", "content": DEMO_NOTES}))
            .with_text("I'll write down some notes in NOTES.md."),
        Reply::tool(
            "edit",
            json!({"path": "NOTES.md", "old_string": "# Notes", "new_string": "# Notes from the Kiln demo"}),
        )
        .with_text("A clearer title would help."),
        Reply::tool("view", json!({"path": "NOTES.md"})).with_text("Let me check the result."),
        Reply::text(
            "Done. I listed the workspace and read README.md, wrote NOTES.md, retitled it with an \
             edit, and read it back to check it. This was the scripted demo model: point Kiln at \
             a real model provider to have it work on your own repository.",
        ),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn demo_script_uses_real_tool_arguments() {
        let script = demo_script();
        assert!(matches!(script.last(), Some(Reply { text: Some(_), tool_calls, .. }) if tool_calls.is_empty()));
        for reply in &script {
            for call in &reply.tool_calls {
                let keys: Vec<&str> =
                    call.arguments.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
                let allowed: &[&str] = match call.name.as_str() {
                    "bash" => &["command", "timeout_s"],
                    "view" => &["path", "offset", "limit"],
                    "write" => &["path", "content"],
                    "edit" => &["path", "old_string", "new_string", "replace_all"],
                    other => panic!("unknown tool {other}"),
                };
                assert!(!keys.is_empty() && keys.iter().all(|k| allowed.contains(k)), "{call:?}");
            }
        }
        let edit = &script[2].tool_calls[0].arguments;
        assert!(DEMO_NOTES.contains(edit["old_string"].as_str().unwrap_or_default()));
    }
}
