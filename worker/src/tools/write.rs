use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Tool, ToolContext, ToolFailure, ToolOutcome, file_outcome, parse_arguments, schema_of};

/// Largest file the model may write in one call.
const MAX_WRITE_BYTES: usize = 10 * 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// File path, relative to /workspace or absolute.
    #[serde(alias = "file_path")]
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
}

pub struct Write;

#[async_trait::async_trait]
impl Tool for Write {
    fn name(&self) -> &'static str {
        "write"
    }
    fn description(&self) -> &'static str {
        "Create or overwrite a file with the given content. Parent directories are created."
    }
    fn schema(&self) -> Value {
        schema_of::<WriteArgs>()
    }
    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: WriteArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        if args.content.len() > MAX_WRITE_BYTES {
            return Ok(ToolOutcome::error(format!("content is over the {MAX_WRITE_BYTES}-byte limit")));
        }
        match ctx.sandbox.write_file(&args.path, args.content.as_bytes()).await {
            Ok(()) => Ok(ToolOutcome::ok(format!("wrote {} bytes to {}", args.content.len(), args.path))),
            Err(e) => file_outcome(e),
        }
    }
}
