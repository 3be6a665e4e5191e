use std::time::Duration;

use kiln_toolbox::protocol::{ExecRequest, ExecResult, Reply, RequestBody, SessionShell};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Answer, Tool, ToolContext, ToolFailure, ToolOutcome, ask_toolbox, parse_arguments, schema_of, unexpected};
use crate::sandbox::SandboxError;

const DEFAULT_TIMEOUT_S: u64 = 120;
const MAX_TIMEOUT_S: u64 = 600;
/// Characters of output returned to the model; head and tail are kept.
const OUTPUT_CAP: usize = 30_000;
/// Output streamed as `tool.output` events per command: enough to watch a
/// build, while a command printing gigabytes cannot flood the event table.
const STREAM_CAP: u64 = 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command to run with bash. The working directory and exported
    /// variables carry over from the previous command (first: /workspace).
    pub command: String,
    /// Seconds before the command and its children are killed (default 120, max 600).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// The `bash` tool. The model knows it by that name whatever the image's
/// shell; its description says which shell the session has, so the model
/// writes for it.
pub struct Bash {
    shell: SessionShell,
}

impl Bash {
    /// The tool for sandboxes with bash (Kiln's own image).
    pub const BASH: Bash = Bash { shell: SessionShell::Bash };

    /// The tool for a sandbox whose commands run with `shell`.
    pub fn for_shell(shell: SessionShell) -> Self {
        Bash { shell }
    }
}

/// What a call gets in a sandbox without a shell.
const NO_SHELL: &str = "this sandbox's image has no shell (neither bash nor sh), so commands cannot run here; use \
     the file tools instead (view, ls, glob, grep, edit, write)";

#[async_trait::async_trait]
impl Tool for Bash {
    fn name(&self) -> &'static str {
        "bash"
    }
    fn description(&self) -> &'static str {
        match self.shell {
            SessionShell::Sh => {
                "Run a command with sh in the workspace (/workspace). This sandbox's image has no bash: commands \
                 run with its POSIX sh, so write POSIX shell (no [[ ]], arrays, `source`, `<(...)` or other \
                 bash-only syntax). `cd` and exported variables persist between calls. Stdin is closed. Output \
                 (stdout and stderr) is returned with the exit code; long output keeps its start and end. A \
                 timeout kills the command and everything it started."
            }
            SessionShell::Absent | SessionShell::Other => {
                "Unavailable here: this sandbox's image has no shell (neither bash nor sh), so commands cannot \
                 run and every call fails. Use view, ls, glob, grep, edit and write for files."
            }
            SessionShell::Bash => {
                "Run a bash command in the workspace (/workspace). `cd` and exported variables persist between \
                 calls. Stdin is closed. Output (stdout and stderr) is returned with the exit code; long output \
                 keeps its start and end. A timeout kills the command and everything it started."
            }
        }
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
        if ctx.sandbox.shell().is_some_and(|s| s.program().is_none()) {
            return Ok(ToolOutcome::error(NO_SHELL));
        }
        let timeout = Duration::from_secs(args.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S).clamp(1, MAX_TIMEOUT_S));
        let request = ExecRequest {
            timeout_ms: timeout.as_millis() as u64,
            output_cap_bytes: OUTPUT_CAP as u64,
            stream_cap_bytes: Some(STREAM_CAP),
            ..ExecRequest::new(args.command.clone())
        };
        match ask_toolbox(ctx, RequestBody::Exec(request), true).await? {
            Answer::Reply(Reply::Exec(result)) => return Ok(exec_outcome(result, timeout)),
            Answer::Reply(other) => return Err(unexpected(self.name(), &other)),
            Answer::Outcome(o) => return Ok(o),
            Answer::NoToolbox => {}
        }
        // No toolbox: one `docker exec` per call (no persistent cwd).
        let out = match ctx.sandbox.exec(&args.command, timeout, OUTPUT_CAP, |_| {}).await {
            Ok(out) => out,
            Err(SandboxError::NoShell { .. }) => return Ok(ToolOutcome::error(NO_SHELL)),
            Err(e) => return Err(e.into()),
        };
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

/// What the model reads: the output, then one bracketed line for anything
/// but a clean exit. Non-zero exits, signals and timeouts are errors.
fn exec_outcome(r: ExecResult, timeout: Duration) -> ToolOutcome {
    let mut text = r.output;
    let mut notes = Vec::new();
    if r.truncated_bytes > 0 {
        notes.push(format!(
            "[output was {} bytes; {} bytes in the middle were omitted]",
            r.total_bytes, r.truncated_bytes
        ));
    }
    if let Some(note) = r.note {
        notes.push(format!("[{note}]"));
    }
    let is_error = if r.timed_out {
        notes.push(format!(
            "[timed out after {} s: the command and every process it started were killed]",
            timeout.as_secs()
        ));
        true
    } else if r.cancelled {
        notes.push("[cancelled]".into());
        true
    } else if let Some(sig) = r.signal {
        notes.push(format!("[killed by signal {sig}{}]", signal_hint(sig)));
        true
    } else {
        match r.exit_code {
            Some(0) => false,
            Some(137) => {
                notes.push("[exit code 137: killed by SIGKILL, often the sandbox's memory limit]".into());
                true
            }
            Some(code) => {
                notes.push(format!("[exit code {code}]"));
                true
            }
            None => {
                notes.push("[exit status unknown]".into());
                true
            }
        }
    };
    for note in notes {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&note);
    }
    ToolOutcome { output: text, is_error }
}

fn signal_hint(sig: i32) -> &'static str {
    match sig {
        9 => " (SIGKILL; often the sandbox's memory limit)",
        15 => " (SIGTERM)",
        11 => " (SIGSEGV)",
        6 => " (SIGABRT)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> ExecResult {
        ExecResult {
            exit_code,
            signal,
            timed_out,
            cancelled: false,
            output: "out\n".into(),
            truncated_bytes: 0,
            total_bytes: 4,
            cwd: "/workspace".into(),
            duration_ms: 1,
            note: None,
        }
    }

    #[test]
    fn the_status_is_told_to_the_model() {
        let t = Duration::from_secs(5);
        assert_eq!(exec_outcome(result(Some(0), None, false), t), ToolOutcome::ok("out\n"));
        let failed = exec_outcome(result(Some(3), None, false), t);
        assert!(failed.is_error && failed.output.ends_with("[exit code 3]"), "{failed:?}");
        let killed = exec_outcome(result(None, Some(9), false), t);
        assert!(killed.is_error && killed.output.contains("signal 9 (SIGKILL"), "{killed:?}");
        let slow = exec_outcome(result(None, Some(9), true), t);
        assert!(slow.is_error && slow.output.contains("timed out after 5 s"), "{slow:?}");
    }

    #[test]
    fn truncation_is_stated() {
        let mut r = result(Some(0), None, false);
        r.truncated_bytes = 100;
        r.total_bytes = 130;
        assert!(exec_outcome(r, Duration::from_secs(1)).output.contains("100 bytes in the middle were omitted"));
    }
}
