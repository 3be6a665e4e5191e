use kiln_toolbox::protocol::{EditRequest, Reply, RequestBody};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, file_outcome, parse_arguments};
use super::{schema_of, unexpected};

const MAX_EDIT_FILE_BYTES: u64 = 10 * 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// File path, relative to /workspace or absolute.
    #[serde(alias = "file_path")]
    pub path: String,
    /// Exact text to replace. Must occur once unless replace_all is true.
    pub old_string: String,
    /// Replacement text.
    pub new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    pub replace_all: Option<bool>,
}

pub struct Edit;

#[async_trait::async_trait]
impl Tool for Edit {
    fn name(&self) -> &'static str {
        "edit"
    }
    fn description(&self) -> &'static str {
        "Replace exact text in a file you have viewed in this session (and that has not changed since). \
         old_string must match exactly once (or set replace_all)."
    }
    fn schema(&self) -> Value {
        schema_of::<EditArgs>()
    }
    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: EditArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        if ctx.sandbox.has_toolbox() {
            return edit_checked(ctx, args).await;
        }
        let bytes = match ctx.sandbox.read_file(&args.path, MAX_EDIT_FILE_BYTES).await {
            Ok(b) => b,
            Err(e) => return file_outcome(e),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(ToolOutcome::error(format!("{} is not valid UTF-8 text; edit it with bash", args.path)));
        };
        let updated = match apply_edit(&text, &args.old_string, &args.new_string, args.replace_all.unwrap_or(false)) {
            Ok(t) => t,
            Err(msg) => return Ok(ToolOutcome::error(format!("{}: {msg}", args.path))),
        };
        match ctx.sandbox.write_file(&args.path, updated.0.as_bytes()).await {
            Ok(()) => Ok(ToolOutcome::ok(format!("replaced {} occurrence(s) in {}", updated.1, args.path))),
            Err(e) => file_outcome(e),
        }
    }
}

/// Through the toolbox, against the version the model last saw.
async fn edit_checked(ctx: &ToolContext<'_>, args: EditArgs) -> Result<ToolOutcome, ToolFailure> {
    let Some(expected) = ctx.sandbox.seen_version(&args.path) else {
        return Ok(ToolOutcome::error(format!(
            "{} has not been viewed in this session; view it first, then edit it",
            args.path
        )));
    };
    let request = EditRequest {
        path: args.path.clone(),
        old_string: args.old_string,
        new_string: args.new_string,
        replace_all: args.replace_all.unwrap_or(false),
        expected: Some(expected),
    };
    match ask_toolbox(ctx, RequestBody::Edit(request), false).await? {
        Answer::Reply(Reply::Edit(r)) => {
            ctx.sandbox.record_seen(&args.path, r.version);
            Ok(ToolOutcome::ok(format!("replaced {} occurrence(s) in {}\n{}", r.replacements, args.path, r.diff)))
        }
        Answer::Reply(other) => Err(unexpected("edit", &other)),
        Answer::Outcome(o) => Ok(o),
        Answer::NoToolbox => Ok(ToolOutcome::error("the sandbox's tool process is unavailable")),
    }
}

/// The edited text and the number of replacements, or why not.
fn apply_edit(text: &str, old: &str, new: &str, replace_all: bool) -> Result<(String, usize), String> {
    if old.is_empty() {
        return Err("old_string must not be empty".into());
    }
    if old == new {
        return Err("old_string and new_string are the same".into());
    }
    let count = text.matches(old).count();
    match (count, replace_all) {
        (0, _) => Err("old_string was not found".into()),
        (1, _) | (_, true) => Ok((text.replace(old, new), count)),
        (n, false) => {
            Err(format!("old_string occurs {n} times; add surrounding context to make it unique, or set replace_all"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::apply_edit;

    #[test]
    fn edit_requires_a_unique_match_unless_replace_all() {
        assert_eq!(apply_edit("a b a", "b", "c", false), Ok(("a c a".into(), 1)));
        assert!(apply_edit("a b a", "a", "c", false).unwrap_err().contains("2 times"));
        assert_eq!(apply_edit("a b a", "a", "c", true), Ok(("c b c".into(), 2)));
        assert!(apply_edit("a", "z", "c", false).unwrap_err().contains("not found"));
        assert!(apply_edit("a", "", "c", false).is_err());
    }
}
