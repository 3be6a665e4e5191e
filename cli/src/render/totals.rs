//! What a run added up to: steps, tokens, cost, wall time and how it ended,
//! from its events alone (so `kiln logs` of an old run shows the same).

use std::time::Duration;

use kiln_protocol::changes::ChangeTotals;
use kiln_protocol::{EventBody, Usage};

use crate::client::StreamedEvent;

/// How the run ended, from its terminal event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed(String),
    Cancelled(String),
    TimedOut(u32),
}

impl Outcome {
    pub fn of(body: &EventBody) -> Option<Outcome> {
        match body {
            EventBody::RunSucceeded { .. } => Some(Outcome::Succeeded),
            EventBody::RunFailed { error } => Some(Outcome::Failed(error.clone())),
            EventBody::RunCancelled { reason } => Some(Outcome::Cancelled(reason.clone())),
            EventBody::RunTimedOut { limit_s } => Some(Outcome::TimedOut(*limit_s)),
            _ => None,
        }
    }

    /// The status word, as `kiln runs` shows it.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed(_) => "failed",
            Outcome::Cancelled(_) => "cancelled",
            Outcome::TimedOut(_) => "timed out",
        }
    }

    /// The word with its reason: `failed: no such model`.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Succeeded => "succeeded".to_owned(),
            Outcome::Failed(why) | Outcome::Cancelled(why) if !why.is_empty() => format!("{}: {why}", self.word()),
            Outcome::TimedOut(limit) => format!("timed out after {limit} s"),
            other => other.word().to_owned(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub steps: u32,
    pub usage: Usage,
    /// Cost of the priced model calls (steps and compactions).
    pub cost_usd: f64,
    /// Whether a model call had no price (so `cost_usd` is a lower bound, or unknown).
    pub unpriced: bool,
    pub tool_calls: u32,
    pub outcome: Option<Outcome>,
    /// From the run's creation to its end, when known.
    pub wall: Option<Duration>,
    /// What the run changed, from `changes.captured` (absent: not captured).
    pub changes: Option<ChangeTotals>,
}

impl Totals {
    pub fn observe(&mut self, event: &StreamedEvent) {
        let Some(body) = event.body() else { return };
        match &body {
            EventBody::StepFinished { usage, cost_usd, .. } => {
                self.steps += 1;
                self.add_cost(usage, *cost_usd);
            }
            EventBody::Compaction { usage, cost_usd, .. } => self.add_cost(usage, *cost_usd),
            // A sub-agent's spending is its parent's (its steps are its own).
            EventBody::SubagentFinished { usage, cost_usd, .. } => self.add_cost(usage, *cost_usd),
            EventBody::ToolResult { .. } => self.tool_calls += 1,
            EventBody::ChangesCaptured { files, additions, deletions, .. } => {
                self.changes = Some(ChangeTotals { files: *files, additions: *additions, deletions: *deletions });
            }
            _ => {
                if let Some(outcome) = Outcome::of(&body) {
                    self.outcome = Some(outcome);
                }
            }
        }
    }

    fn add_cost(&mut self, usage: &Usage, cost: Option<f64>) {
        self.usage.add(usage);
        match cost {
            Some(usd) => self.cost_usd += usd,
            None => self.unpriced = true,
        }
    }

    /// The cost as a person reads it: `$0.0123`, `$0.0123+` when some calls
    /// had no price, `n/a` when none had.
    pub fn cost(&self) -> String {
        match (self.cost_usd > 0.0, self.unpriced) {
            (true, false) => usd(self.cost_usd),
            (true, true) => format!("{}+", usd(self.cost_usd)),
            (false, true) => "n/a".to_owned(),
            (false, false) if self.steps == 0 => "—".to_owned(),
            (false, false) => usd(0.0),
        }
    }

    /// The closing line: `3 steps · 2 tool calls · 1,234 tokens in / 56 out · $0.0013 · 8.2 s · succeeded`,
    /// with `+ 3,948 cached` after the input when the provider served part
    /// of it from its cache (billed, at its own price, so it is shown).
    pub fn line(&self) -> String {
        self.line_with(true)
    }

    /// The closing line, its outcome without the reason: for output that
    /// printed the run's end (`● run failed: …`) just above it.
    pub fn line_without_reason(&self) -> String {
        self.line_with(false)
    }

    fn line_with(&self, reason: bool) -> String {
        let mut parts =
            vec![plural(self.steps, "step"), plural(self.tool_calls, "tool call"), self.tokens(), self.cost()];
        if let Some(wall) = self.wall {
            parts.push(format!("{:.1} s", wall.as_secs_f64()));
        }
        parts.push(match &self.outcome {
            None => "not finished".to_owned(),
            Some(outcome) if reason => outcome.describe(),
            Some(Outcome::TimedOut(limit)) => format!("timed out after {limit} s"),
            Some(outcome) => outcome.word().to_owned(),
        });
        parts.join(" · ")
    }
}

impl Totals {
    fn tokens(&self) -> String {
        let u = &self.usage;
        let cached = u.cache_read_tokens + u.cache_write_tokens;
        let input = if cached > 0 {
            format!("{} tokens in + {} cached", thousands(u.input_tokens), thousands(cached))
        } else {
            format!("{} tokens in", thousands(u.input_tokens))
        };
        format!("{input} / {} out", thousands(u.output_tokens))
    }
}

fn plural(n: u32, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

pub fn usd(v: f64) -> String {
    if v >= 1.0 { format!("${v:.2}") } else { format!("${v:.4}") }
}

pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: i64, kind: &str, payload: serde_json::Value) -> StreamedEvent {
        StreamedEvent { seq, kind: kind.into(), payload }
    }

    #[test]
    fn totals_add_up_steps_tokens_cost_and_the_end() {
        let mut t = Totals::default();
        let usage = json!({"input_tokens": 1200, "output_tokens": 30});
        t.observe(&ev(
            1,
            "step.finished",
            json!({"step": 1, "finish_reason": "tool_calls", "usage": usage, "cost_usd": 0.00123}),
        ));
        t.observe(&ev(
            2,
            "tool.result",
            json!({"call_id": "c", "name": "bash", "output": "", "is_error": false, "duration_ms": 4}),
        ));
        t.observe(&ev(
            3,
            "step.finished",
            json!({"step": 2, "finish_reason": "stop", "usage": usage, "cost_usd": 0.001}),
        ));
        t.observe(&ev(4, "run.failed", json!({"error": "boom"})));
        t.wall = Some(Duration::from_millis(8_240));
        assert_eq!(t.line(), "2 steps · 1 tool call · 2,400 tokens in / 60 out · $0.0022 · 8.2 s · failed: boom");
    }

    #[test]
    fn cached_input_is_counted_and_shown() {
        let mut t = Totals::default();
        let usage =
            json!({"input_tokens": 25, "output_tokens": 7, "cache_read_tokens": 1974, "cache_write_tokens": 10});
        for step in 1..=2 {
            t.observe(&ev(
                step,
                "step.finished",
                json!({"step": step, "finish_reason": "stop", "usage": usage, "cost_usd": null}),
            ));
        }
        assert!(t.line().contains("50 tokens in + 3,968 cached / 14 out"), "{}", t.line());
    }

    #[test]
    fn unpriced_calls_make_the_cost_unknown_or_a_lower_bound() {
        let mut t = Totals::default();
        let usage = json!({"input_tokens": 1, "output_tokens": 1});
        t.observe(&ev(1, "step.finished", json!({"step": 1, "finish_reason": "stop", "usage": usage})));
        assert_eq!(t.cost(), "n/a");
        t.observe(&ev(
            2,
            "compaction",
            json!({"summarized_messages": 4, "kept_messages": 2, "input_tokens": 9, "usage": usage, "cost_usd": 0.5}),
        ));
        assert_eq!(t.cost(), "$0.5000+");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
