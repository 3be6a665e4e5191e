//! Loop guard: a model that repeats the same tool calls with the same
//! arguments is nudged, then stopped.

use super::tool_call::ToolCall;

/// Identical consecutive steps before the model is nudged.
pub const NUDGE_AT: u32 = 3;
/// Identical consecutive steps before the run is stopped.
pub const STOP_AT: u32 = 5;

#[derive(Debug, Default)]
pub struct LoopGuard {
    last: Option<String>,
    repeats: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Nudge(String),
    Stop(String),
}

impl LoopGuard {
    /// Looks at one step's tool calls (their names and arguments, in order).
    pub fn observe(&mut self, calls: &[ToolCall]) -> Verdict {
        // serde_json's maps are ordered by key, so equal arguments print equal.
        let signature: String = calls.iter().map(|call| format!("{}:{}\n", call.name, call.arguments)).collect();
        if signature.is_empty() {
            *self = LoopGuard::default();
            return Verdict::Continue;
        }
        if self.last.as_deref() == Some(signature.as_str()) {
            self.repeats += 1;
        } else {
            self.last = Some(signature);
            self.repeats = 1;
        }
        match self.repeats {
            n if n >= STOP_AT => Verdict::Stop(format!(
                "loop guard: the model made the same tool call with the same arguments {n} times in a row"
            )),
            n if n == NUDGE_AT => Verdict::Nudge(format!(
                "[kiln] You have made the same tool call with the same arguments {n} times in a row and got the \
                 same result. Do something different, or finish and summarise."
            )),
            _ => Verdict::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn call(name: &str, arguments: &Value) -> [ToolCall; 1] {
        [ToolCall { id: "1".into(), name: name.into(), arguments: arguments.clone(), provider_id: None }]
    }

    #[test]
    fn repeats_nudge_then_stop_and_a_change_resets() {
        let args = json!({"command": "ls"});
        let other = json!({"command": "pwd"});
        let mut g = LoopGuard::default();
        assert_eq!(g.observe(&call("bash", &args)), Verdict::Continue);
        assert_eq!(g.observe(&call("bash", &args)), Verdict::Continue);
        assert!(matches!(g.observe(&call("bash", &args)), Verdict::Nudge(_)));
        assert_eq!(g.observe(&call("bash", &args)), Verdict::Continue);
        assert!(matches!(g.observe(&call("bash", &args)), Verdict::Stop(_)));
        let mut g = LoopGuard::default();
        g.observe(&call("bash", &args));
        g.observe(&call("bash", &args));
        assert_eq!(g.observe(&call("bash", &other)), Verdict::Continue);
        assert_eq!(g.observe(&call("bash", &other)), Verdict::Continue);
    }

    #[test]
    fn argument_key_order_does_not_matter() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":2}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b":2,"a":1}"#).unwrap();
        let mut g = LoopGuard::default();
        g.observe(&call("x", &a));
        g.observe(&call("x", &b));
        assert!(matches!(g.observe(&call("x", &a)), Verdict::Nudge(_)));
    }
}
