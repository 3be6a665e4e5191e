//! Compaction: when a step's input nears the model's context window, the
//! older part of the conversation is summarised by the model and the
//! summary stands in for it (the full history stays in the database).
//!
//! The cut never separates tool results from the call that asked for them,
//! and the most recent messages (up to a share of the window) stay verbatim.
//! The summary is stored as a message and announced with a `compaction`
//! event.

use kiln_protocol::{EventBody, Message, Part, Role, Usage};

use super::budget::Budget;
use super::{AgentError, AgentRun, model_call};
use crate::db_retry::with_retry;
use crate::providers::ModelRequest;

/// Instructions for the summarising call, in their own file for review.
pub const PROMPT: &str = include_str!("compaction_prompt.md");
/// Share of the context window the verbatim recent messages may take.
const KEEP_SHARE: f64 = 0.3;
/// Share of the context window the transcript sent for summarising may take.
const TRANSCRIPT_SHARE: f64 = 0.6;
/// Longest tool output quoted in the transcript: the summary needs the gist.
const TOOL_OUTPUT_CHARS: usize = 2_000;
/// A rough, provider-independent token estimate: about four bytes a token.
const BYTES_PER_TOKEN: usize = 4;
/// Opens the stored summary, so the model knows what it is reading.
pub const SUMMARY_HEADER: &str = "[kiln] The earlier part of this conversation was compacted to save context. \
     Summary of it:";

/// When to compact.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub context_window: u32,
    /// Fraction of the window a step's input may reach.
    pub threshold: f64,
}

impl Policy {
    /// Whether a step whose input was `usage` calls for compaction.
    pub fn due(&self, usage: &Usage) -> bool {
        let input = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
        input as f64 > self.threshold * f64::from(self.context_window)
    }

    fn tokens(&self, share: f64) -> usize {
        (share * f64::from(self.context_window)) as usize
    }
}

/// Where to cut `messages`: everything before the index is summarised, the
/// rest kept. `None` when there is nothing worth summarising.
pub fn cut_point(messages: &[Message], policy: &Policy) -> Option<usize> {
    let budget = policy.tokens(KEEP_SHARE) * BYTES_PER_TOKEN;
    let mut kept = 0usize;
    let mut cut = messages.len();
    while cut > 1 {
        let size = approx_bytes(&messages[cut - 1]);
        if kept + size > budget {
            break;
        }
        kept += size;
        cut -= 1;
    }
    // Tool results belong with the call before them: keep both, or neither.
    while cut < messages.len() && messages[cut].role == Role::Tool {
        cut += 1;
    }
    // Something must be summarised, and something other than an earlier
    // summary alone (index 0) must be summarised with it, or nothing shrinks.
    let worth_it = cut >= 2 || (cut == 1 && !is_summary(&messages[0]));
    (worth_it && cut < messages.len()).then_some(cut)
}

/// The request text for summarising `older` (with [`PROMPT`] as the
/// system prompt): a plain transcript (tool calls as text, so no tool
/// definitions are needed), cut to fit.
pub fn transcript(older: &[Message], policy: &Policy) -> String {
    let mut out = String::new();
    for message in older {
        out.push_str(&render(message));
        out.push('\n');
    }
    let limit = policy.tokens(TRANSCRIPT_SHARE) * BYTES_PER_TOKEN;
    if out.len() > limit {
        // The start holds the task; the end, the latest state.
        let head = out.floor_char_boundary(limit / 3);
        let tail = out.ceil_char_boundary(out.len() - (limit - head));
        let dropped = tail - head;
        out = format!("{}\n[... {dropped} bytes of the transcript left out ...]\n{}", &out[..head], &out[tail..]);
    }
    format!("<transcript>\n{out}</transcript>")
}

/// The message stored in place of the summarised part.
pub fn summary_message(summary: &str) -> Message {
    Message::user(format!("{SUMMARY_HEADER}\n\n{}", summary.trim()))
}

fn is_summary(message: &Message) -> bool {
    message.role == Role::User && message.text().starts_with(SUMMARY_HEADER)
}

fn render(message: &Message) -> String {
    let mut out = format!("## {}\n", message.role.as_str());
    for part in &message.parts {
        match part {
            Part::Text { text } => out.push_str(text),
            // Hidden reasoning is the model's own; the summary works from
            // what was said and done.
            Part::Reasoning { .. } => continue,
            Part::ToolCall { name, arguments, .. } => out.push_str(&format!("[called {name} {arguments}]")),
            Part::ToolResult { name, output, is_error, .. } => {
                let status = if *is_error { " (error)" } else { "" };
                let cut = output.floor_char_boundary(TOOL_OUTPUT_CHARS);
                let more = if cut < output.len() {
                    format!(" [... {} more bytes]", output.len() - cut)
                } else {
                    String::new()
                };
                out.push_str(&format!("[result of {name}{status}]\n{}{more}", &output[..cut]));
            }
        }
        out.push('\n');
    }
    out
}

fn approx_bytes(message: &Message) -> usize {
    message
        .parts
        .iter()
        .map(|p| match p {
            Part::Text { text } | Part::Reasoning { text, .. } => text.len(),
            Part::ToolCall { name, arguments, .. } => name.len() + arguments.to_string().len(),
            Part::ToolResult { output, .. } => output.len(),
        })
        .sum::<usize>()
        + 16
}

impl AgentRun<'_> {
    /// Summarises the older part of the conversation and continues from the
    /// summary plus the recent messages. A failed summarising call leaves
    /// the conversation as it is (the next step may still fit).
    pub(super) async fn compact(
        &mut self,
        messages: &mut Vec<Message>,
        input: &Usage,
        budget: &mut Budget,
    ) -> Result<(), AgentError> {
        let Some(cut) = cut_point(messages, &self.compaction) else { return Ok(()) };
        let request = self.summary_request(&messages[..cut]);
        let assembled = match model_call::call_model_quietly(self.provider.as_ref(), &request, self.events).await {
            Ok(a) => a,
            Err(AgentError::Provider(e)) => {
                tracing::warn!(run_id = %self.run.id, error = %e, "compaction failed; going on without it");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        // Spent whether or not the summary is of use: counted before it is
        // looked at, so the budget check before the next call sees it.
        let cost = (self.pricing)(&self.model, &assembled.usage);
        budget.record(&assembled.usage, cost);
        let summary = assembled.message.text();
        if summary.trim().is_empty() {
            tracing::warn!(run_id = %self.run.id, "the model's summary was empty; not compacting");
            return Ok(());
        }
        let summary = summary_message(&summary);
        let kept = messages.len() - cut;
        let message_id = uuid::Uuid::now_v7();
        with_retry(|| {
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
            .write_now(EventBody::Compaction {
                summarized_messages: cut as u32,
                kept_messages: kept as u32,
                input_tokens: input.input_tokens + input.cache_read_tokens + input.cache_write_tokens,
                usage: assembled.usage,
                cost_usd: cost,
            })
            .await?;
        Ok(())
    }

    /// The call that asks the model to summarise `older`.
    fn summary_request(&self, older: &[Message]) -> ModelRequest {
        ModelRequest {
            model: self.model.clone(),
            system: PROMPT.to_owned(),
            messages: vec![Message::user(transcript(older, &self.compaction))],
            tools: Vec::new(),
            max_tokens: self.max_tokens,
            temperature: None,
            // A one-off prompt: nothing to reuse.
            cache_key: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assistant_call(id: &str) -> Message {
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.into(),
                name: "bash".into(),
                arguments: json!({"command": "ls"}),
                provider_id: None,
            }],
        }
    }

    fn result(id: &str, size: usize) -> Message {
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id.into(),
                name: "bash".into(),
                output: "x".repeat(size),
                is_error: false,
                provider_call_id: None,
            }],
        }
    }

    const POLICY: Policy = Policy { context_window: 1_000, threshold: 0.8 };

    #[test]
    fn due_counts_cached_input_too() {
        assert!(!POLICY.due(&Usage { input_tokens: 800, ..Default::default() }));
        assert!(POLICY.due(&Usage { input_tokens: 500, cache_read_tokens: 301, ..Default::default() }));
    }

    #[test]
    fn the_cut_keeps_recent_messages_and_never_orphans_tool_results() {
        // Keep budget: 300 tokens ≈ 1,200 bytes.
        let messages = vec![
            Message::user("task"),
            assistant_call("1"),
            result("1", 5_000),
            assistant_call("2"),
            result("2", 500),
            Message::user("more"),
        ];
        assert_eq!(cut_point(&messages, &POLICY), Some(3));
        // A big last result: the cut moves past it rather than split the pair,
        // and with nothing left to keep there is no cut.
        let messages = vec![Message::user("task"), assistant_call("1"), result("1", 5_000)];
        assert_eq!(cut_point(&messages, &POLICY), None);
        let messages =
            vec![Message::user("task"), Message::user("x".repeat(5_000)), assistant_call("1"), result("1", 9)];
        assert_eq!(cut_point(&messages, &POLICY), Some(2));
        // An earlier summary alone is not worth summarising again.
        let messages = vec![summary_message("before"), Message::user("x".repeat(5_000))];
        assert_eq!(cut_point(&messages, &POLICY), None);
    }

    #[test]
    fn the_transcript_shows_calls_as_text_and_fits_the_window() {
        let messages = vec![Message::user("fix the bug"), assistant_call("1"), result("1", 50_000)];
        let text = transcript(&messages, &POLICY);
        assert!(text.starts_with("<transcript>"));
        assert!(text.contains("fix the bug"));
        assert!(text.contains("[called bash {\"command\":\"ls\"}]"));
        assert!(text.len() < 2_400 + 200, "{}", text.len());
        assert!(text.contains("bytes of the transcript left out") || text.contains("more bytes]"));
    }
}
