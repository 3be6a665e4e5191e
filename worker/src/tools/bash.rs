use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Tool, ToolContext, ToolFailure, ToolOutcome, parse_arguments, schema_of};

const DEFAULT_TIMEOUT_S: u64 = 120;
const MAX_TIMEOUT_S: u64 = 600;
/// Characters of output returned to the model; head and tail are kept.
const OUTPUT_CAP: usize = 30_000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command to run with bash in /workspace.
    pub command: String,
    /// Seconds before the command and its children are killed (default 120, max 600).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

pub struct Bash;

#[async_trait::async_trait]
impl Tool for Bash {
    fn name(&self) -> &'static str {
        "bash"
    }
    fn description(&self) -> &'static str {
        "Run a bash command in the workspace (/workspace). Stdin is closed. Output (stdout and stderr) \
         is returned with the exit code; long output keeps its start and end."
    }
    fn schema(&self) -> Value {
        schema_of::<BashArgs>()
    }
    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: BashArgs = match parse_arguments(self.name(), args) {
            Ok(a) => a,
            Err(outcome) => return Ok(outcome),
        };
        if args.command.trim().is_empty() {
            return Ok(ToolOutcome::error("command must not be empty"));
        }
        let timeout = Duration::from_secs(args.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S).clamp(1, MAX_TIMEOUT_S));
        let out = ctx.sandbox.exec(&args.command, timeout, OUTPUT_CAP, |_| {}).await?;
        let mut text = out.output;
        if out.timed_out {
            text.push_str(&format!("\n[command timed out after {} s and was killed]", timeout.as_secs()));
            return Ok(ToolOutcome::error(text));
        }
        match out.exit_code {
            Some(0) => Ok(ToolOutcome::ok(text)),
            Some(code) => {
                text.push_str(&format!("\n[exit code {code}]"));
                Ok(ToolOutcome::error(text))
            }
            None => Ok(ToolOutcome::error(format!("{text}\n[exit code unknown]"))),
        }
    }
}
