use kiln_toolbox::protocol::{ErrorKind, Reply, RequestBody, StatRequest, WriteRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, TOOLBOX_DIED, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, file_outcome};
use super::{parse_arguments, schema_of, unexpected};
use crate::sandbox::ToolboxError;

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
        "Create a file, or overwrite one you have viewed in this session (and that has not changed since), \
         with the given content. Parent directories are created."
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
        if ctx.sandbox.has_toolbox() {
            return write_checked(ctx, args).await;
        }
        match ctx.sandbox.write_file(&args.path, args.content.as_bytes()).await {
            Ok(()) => Ok(ToolOutcome::ok(format!("wrote {} bytes to {}", args.content.len(), args.path))),
            Err(e) => file_outcome(e),
        }
    }
}

/// Through the toolbox: an existing file must have been viewed and be
/// unchanged since; a new one needs no view.
async fn write_checked(ctx: &ToolContext<'_>, args: WriteArgs) -> Result<ToolOutcome, ToolFailure> {
    let expected = match ctx.sandbox.seen_version(&args.path) {
        Some(v) => Some(v),
        None => {
            let stat = RequestBody::Stat(StatRequest { path: args.path.clone() });
            match ctx.sandbox.toolbox_call(stat, None).await {
                Ok(Some(Reply::Stat(_))) => {
                    return Ok(ToolOutcome::error(format!(
                        "{} already exists and has not been viewed in this session; view it first, then write \
                         or edit it",
                        args.path
                    )));
                }
                Ok(Some(Reply::Error(e))) if e.kind == ErrorKind::NotFound => None,
                Err(ToolboxError::Died) => return Ok(ToolOutcome::error(TOOLBOX_DIED)),
                // Anything else surfaces from the write itself.
                _ => None,
            }
        }
    };
    let len = args.content.len();
    let request = WriteRequest { path: args.path.clone(), content: args.content, expected };
    match ask_toolbox(ctx, RequestBody::Write(request), false).await? {
        Answer::Reply(Reply::Write(r)) => {
            ctx.sandbox.record_seen(&args.path, r.version);
            let verb = if r.created { "created" } else { "wrote" };
            Ok(ToolOutcome::ok(format!("{verb} {} ({len} bytes)", args.path)))
        }
        Answer::Reply(other) => Err(unexpected("write", &other)),
        Answer::Outcome(o) => Ok(o),
        Answer::NoToolbox => Ok(ToolOutcome::error("the sandbox's tool process is unavailable")),
    }
}
