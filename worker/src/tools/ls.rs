use kiln_toolbox::protocol::{LsRequest, Reply, RequestBody, defaults};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, NEEDS_TOOLBOX, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, parse_arguments};
use super::{schema_of, unexpected};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LsArgs {
    /// Directory to list, relative to /workspace or absolute (default /workspace).
    #[serde(default, alias = "file_path")]
    pub path: Option<String>,
}

pub struct Ls;

#[async_trait::async_trait]
impl Tool for Ls {
    fn name(&self) -> &'static str {
        "ls"
    }
    fn description(&self) -> &'static str {
        "List a directory: one entry a line, directories with a trailing /, files with their size."
    }
    fn schema(&self) -> Value {
        schema_of::<LsArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: LsArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        let path = args.path.filter(|p| !p.is_empty()).unwrap_or_else(|| ".".into());
        let request = LsRequest { path, max_entries: defaults::LS_MAX_ENTRIES };
        match ask_toolbox(ctx, RequestBody::Ls(request), false).await? {
            Answer::Reply(Reply::Ls(r)) => Ok(ToolOutcome::ok(format!("{}:\n{}", r.path, r.render()))),
            Answer::Reply(other) => Err(unexpected(self.name(), &other)),
            Answer::Outcome(o) => Ok(o),
            Answer::NoToolbox => Ok(ToolOutcome::error(NEEDS_TOOLBOX)),
        }
    }
}
