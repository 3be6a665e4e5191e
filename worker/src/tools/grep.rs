use kiln_toolbox::protocol::{GrepRequest, Reply, RequestBody, defaults};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, NEEDS_TOOLBOX, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, parse_arguments};
use super::{schema_of, unexpected};

/// Context lines either side of a match, at most.
const MAX_CONTEXT: u32 = 10;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Regular expression (Rust regex syntax), or a plain string with literal=true.
    pub pattern: String,
    /// File or directory to search, relative to /workspace or absolute (default /workspace).
    #[serde(default, alias = "file_path")]
    pub path: Option<String>,
    /// Only search files whose name matches this glob, e.g. `*.rs`.
    #[serde(default)]
    pub include: Option<String>,
    /// Treat the pattern as a plain string.
    #[serde(default)]
    pub literal: Option<bool>,
    /// Match case-insensitively.
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// Lines of context before and after each match (default 0, max 10).
    #[serde(default)]
    pub context: Option<u32>,
}

pub struct Grep;

#[async_trait::async_trait]
impl Tool for Grep {
    fn name(&self) -> &'static str {
        "grep"
    }
    fn description(&self) -> &'static str {
        "Search file contents (ripgrep rules: .gitignore respected, binary files skipped). \
         Prints path:line:text for matches and path-line-text for context lines."
    }
    fn schema(&self) -> Value {
        schema_of::<GrepArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: GrepArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        if args.pattern.is_empty() {
            return Ok(ToolOutcome::error("pattern must not be empty"));
        }
        let request = GrepRequest {
            pattern: args.pattern,
            path: args.path.filter(|p| !p.is_empty()),
            include: args.include.filter(|p| !p.is_empty()),
            literal: args.literal.unwrap_or(false),
            case_insensitive: args.case_insensitive.unwrap_or(false),
            context: args.context.unwrap_or(0).min(MAX_CONTEXT),
            max_results: defaults::GREP_MAX_RESULTS,
        };
        match ask_toolbox(ctx, RequestBody::Grep(request), false).await? {
            Answer::Reply(Reply::Grep(r)) => Ok(ToolOutcome::ok(r.render())),
            Answer::Reply(other) => Err(unexpected(self.name(), &other)),
            Answer::Outcome(o) => Ok(o),
            Answer::NoToolbox => Ok(ToolOutcome::error(NEEDS_TOOLBOX)),
        }
    }
}
