//! `todo`: the agent's plan. Nothing runs in the sandbox; the list is
//! echoed back to the model (so it sees its plan after compaction too) and
//! shown to clients as a `todo` event (the agent loop emits it).

use kiln_protocol::{TodoItem, TodoStatus};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Tool, ToolContext, ToolFailure, ToolOutcome, parse_arguments, schema_of};

pub const NAME: &str = "todo";
/// Bounds on what a model may put in a plan: it is stored in an event and
/// rendered by every client.
const MAX_ITEMS: usize = 50;
const MAX_TEXT_CHARS: usize = 500;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodoArgs {
    /// The whole plan, in order; each call replaces the previous list.
    pub items: Vec<TodoArgItem>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodoArgItem {
    /// What to do, in a short sentence.
    #[serde(alias = "content")]
    pub text: String,
    /// `pending`, `in_progress` or `done`.
    #[serde(default)]
    pub status: TodoStatus,
}

/// The plan in a call's arguments, if they are valid.
pub fn items(args: &Value) -> Result<Vec<TodoItem>, String> {
    let args: TodoArgs =
        serde_json::from_value(args.clone()).map_err(|e| format!("invalid arguments for todo: {e}"))?;
    if args.items.len() > MAX_ITEMS {
        return Err(format!("a plan has at most {MAX_ITEMS} items; this one has {}", args.items.len()));
    }
    args.items
        .into_iter()
        .map(|item| {
            let text = item.text.trim();
            if text.is_empty() {
                return Err("every item needs a text".to_owned());
            }
            if text.chars().count() > MAX_TEXT_CHARS {
                return Err(format!("item texts are at most {MAX_TEXT_CHARS} characters"));
            }
            Ok(TodoItem { text: text.to_owned(), status: item.status })
        })
        .collect()
}

fn render(items: &[TodoItem]) -> String {
    if items.is_empty() {
        return "The plan is empty.".to_owned();
    }
    let done = items.iter().filter(|i| i.status == TodoStatus::Done).count();
    let mut out = format!("Plan updated ({done}/{} done):\n", items.len());
    for item in items {
        let mark = match item.status {
            TodoStatus::Pending => "[ ]",
            TodoStatus::InProgress => "[~]",
            TodoStatus::Done => "[x]",
        };
        out.push_str(&format!("{mark} {}\n", item.text));
    }
    out
}

pub struct Todo;

#[async_trait::async_trait]
impl Tool for Todo {
    fn name(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        "Record your plan for a task of several steps as a checklist the user can follow: the whole list each \
         time, with each item's status (pending, in_progress, done). Update it as you go; skip it for small tasks."
    }
    fn schema(&self) -> Value {
        schema_of::<TodoArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        // Parsed twice (here and by the loop for the event): cheap, and the
        // tool stays a plain `Tool`.
        if let Err(outcome) = parse_arguments::<TodoArgs>(self.name(), args.clone()) {
            return Ok(outcome);
        }
        Ok(match items(&args) {
            Ok(items) => ToolOutcome::ok(render(&items)),
            Err(e) => ToolOutcome::error(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_accept_content_as_text_and_default_to_pending() {
        let got = items(&json!({"items": [
            {"content": "read the code", "status": "done"},
            {"text": "fix it", "status": "in_progress"},
            {"text": "test it"},
        ]}))
        .unwrap();
        assert_eq!(
            got.iter().map(|i| (i.text.as_str(), i.status)).collect::<Vec<_>>(),
            [("read the code", TodoStatus::Done), ("fix it", TodoStatus::InProgress), ("test it", TodoStatus::Pending)]
        );
        assert_eq!(render(&got), "Plan updated (1/3 done):\n[x] read the code\n[~] fix it\n[ ] test it\n");
    }

    #[test]
    fn bad_plans_are_the_models_to_fix() {
        assert!(items(&json!({"items": [{"text": "  "}]})).is_err());
        assert!(items(&json!({"items": [{"text": "a", "status": "someday"}]})).is_err());
        assert!(items(&json!({"items": [{"text": "x".repeat(501)}]})).is_err());
        let many: Vec<Value> = (0..51).map(|i| json!({"text": format!("step {i}")})).collect();
        assert!(items(&json!({ "items": many })).unwrap_err().contains("at most 50"));
    }
}
