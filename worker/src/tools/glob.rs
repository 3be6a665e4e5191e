use kiln_toolbox::protocol::{GlobRequest, Reply, RequestBody, defaults};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, NEEDS_TOOLBOX, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, parse_arguments};
use super::{schema_of, unexpected};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// Glob pattern. Without a `/` it matches file names at any depth (`*.rs`);
    /// with one, paths under `path` (`src/**/*.rs`).
    pub pattern: String,
    /// Directory to search, relative to /workspace or absolute (default /workspace).
    #[serde(default, alias = "file_path")]
    pub path: Option<String>,
}

pub struct Glob;

#[async_trait::async_trait]
impl Tool for Glob {
    fn name(&self) -> &'static str {
        "glob"
    }
    fn description(&self) -> &'static str {
        "Find files by name pattern, sorted. .gitignore is respected and .git skipped."
    }
    fn schema(&self) -> Value {
        schema_of::<GlobArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: GlobArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        let request = GlobRequest {
            pattern: args.pattern,
            path: args.path.filter(|p| !p.is_empty()),
            max_results: defaults::GLOB_MAX_RESULTS,
        };
        match ask_toolbox(ctx, RequestBody::Glob(request), false).await? {
            Answer::Reply(Reply::Glob(r)) => Ok(ToolOutcome::ok(r.render())),
            Answer::Reply(other) => Err(unexpected(self.name(), &other)),
            Answer::Outcome(o) => Ok(o),
            Answer::NoToolbox => Ok(ToolOutcome::error(NEEDS_TOOLBOX)),
        }
    }
}
