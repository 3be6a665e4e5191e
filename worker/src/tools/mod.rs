//! The tools the model can call. One file per tool, each with a serde args
//! struct whose JSON schema is generated from it (schemars), so the schema
//! the model sees and the parser can never disagree.
//!
//! Two tiers of failure: a problem the model can act on (no such file,
//! `old_string` not found, non-zero exit) is a [`ToolOutcome`] with
//! `is_error`; only infrastructure failure (the container is gone) is a
//! [`ToolFailure`], which ends the run.

mod bash;
mod edit;
mod glob;
mod grep;
mod ls;
pub mod stream;
pub mod task;
pub mod todo;
mod view;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use kiln_toolbox::protocol::{Reply, RequestBody, ToolError};

use crate::providers::ToolSpec;
use crate::sandbox::{FileError, OutputSink, Sandbox, SandboxError, ToolboxError};

pub use stream::OutputStream;

/// What a tool call returns to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    pub output: String,
    pub is_error: bool,
}

impl ToolOutcome {
    pub fn ok(output: impl Into<String>) -> Self {
        ToolOutcome { output: output.into(), is_error: false }
    }
    pub fn error(output: impl Into<String>) -> Self {
        ToolOutcome { output: output.into(), is_error: true }
    }
}

/// Infrastructure failure: the run cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("sandbox failure: {0}")]
pub struct ToolFailure(#[from] pub SandboxError);

/// Maps a file error to the right tier.
fn file_outcome(e: FileError) -> Result<ToolOutcome, ToolFailure> {
    match e {
        FileError::Sandbox(inner) => Err(ToolFailure(inner)),
        other => Ok(ToolOutcome::error(other.to_string())),
    }
}

/// Everything a tool call may use.
pub struct ToolContext<'a> {
    pub sandbox: &'a Sandbox,
    /// Where a running command's output goes as it arrives (`tool.output`
    /// events); `None` when nobody listens.
    pub output: Option<OutputSink>,
    /// The call's id (Kiln's, `{step}-{n}`).
    pub call_id: &'a str,
    /// What a `task` call starts sub-agents with; `None` where none may start.
    pub subagents: Option<&'a dyn task::TaskRunner>,
}

/// Told to the model when the toolbox died under its call.
const TOOLBOX_DIED: &str = "the sandbox's tool process died during this call (it was killed, or the sandbox ran out \
     of memory); the call's result is lost and its effects may or may not have happened. It is restarted for the \
     next call: every process left in the sandbox is stopped first, and the next command starts in /workspace with \
     the default environment.";

/// How a toolbox request went, in the terms a tool needs.
enum Answer {
    Reply(Reply),
    /// The sandbox has no toolbox: use the per-exec path (or refuse).
    NoToolbox,
    /// Already the model-facing result (the toolbox died, or answered with
    /// an error the model can act on).
    Outcome(ToolOutcome),
}

/// Sends one request to the sandbox's toolbox and sorts the answer into the
/// two tiers: model-fixable errors become outcomes, the rest failures.
async fn ask_toolbox(ctx: &ToolContext<'_>, body: RequestBody, stream: bool) -> Result<Answer, ToolFailure> {
    let output = if stream { ctx.output.clone() } else { None };
    match ctx.sandbox.toolbox_call(body, output).await {
        Ok(None) => Ok(Answer::NoToolbox),
        Ok(Some(Reply::Error(e))) => toolbox_error(e).map(Answer::Outcome),
        Ok(Some(reply)) => Ok(Answer::Reply(reply)),
        Err(ToolboxError::Died) => Ok(Answer::Outcome(ToolOutcome::error(TOOLBOX_DIED))),
        // A restart that failed (the sandbox is out of processes or memory):
        // the model may free them up; the next call tries again.
        Err(ToolboxError::Start(e)) => Ok(Answer::Outcome(ToolOutcome::error(format!(
            "the sandbox's tool process could not be restarted ({e}); the sandbox may be out of processes or memory"
        )))),
        // The toolbox broke one of the worker's caps: the model cannot fix
        // that, but the run can go on (the next call may restart it).
        Err(ToolboxError::Misbehaved(e)) => {
            Ok(Answer::Outcome(ToolOutcome::error(format!("{e}; the call's result was discarded"))))
        }
        Err(e) => Err(ToolFailure(e.into())),
    }
}

fn toolbox_error(e: ToolError) -> Result<ToolOutcome, ToolFailure> {
    if e.kind.is_model_fixable() {
        Ok(ToolOutcome::error(e.message))
    } else {
        Err(ToolFailure(ToolboxError::Unexpected(e.to_string()).into()))
    }
}

/// A reply of the wrong type: a toolbox bug or version skew, not the model's.
fn unexpected(tool: &str, reply: &Reply) -> ToolFailure {
    ToolFailure(SandboxError::Toolbox(ToolboxError::Unexpected(format!("{tool} got {reply:?}"))))
}

/// What the read-only search tools say when the sandbox has no toolbox.
const NEEDS_TOOLBOX: &str = "this sandbox has no toolbox process, so this tool is unavailable; use bash \
     (ls, find, grep) instead";

#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by (MCP tools' names are made at run time).
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn schema(&self) -> Value;
    /// Whether the tool changes the workspace (runs serially, may need approval).
    fn is_mutating(&self) -> bool;
    /// For a tool of an MCP server: the server, and the tool as it names
    /// it (what an approval request shows). `None` for the built-in tools.
    fn mcp_origin(&self) -> Option<kiln_store::McpCall<'_>> {
        None
    }
    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure>;
}

/// Parses a tool's arguments; a mismatch is the model's to fix.
pub fn parse_arguments<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolOutcome> {
    serde_json::from_value(args).map_err(|e| ToolOutcome::error(format!("invalid arguments for {tool}: {e}")))
}

/// The JSON schema of an args struct, without the keys providers reject.
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut value = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Some(obj) = value.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
    }
    value
}

/// The set of tools offered to the model.
#[derive(Clone)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// The tools' definitions, made once: a run shows them to the model at
    /// every step, and generating their JSON schemas each time was about a
    /// tenth of a millisecond of the loop's own time per step (`bench/`,
    /// loop_overhead).
    specs: Arc<[ToolSpec]>,
}

impl Registry {
    pub fn standard() -> Self {
        let tools: [Arc<dyn Tool>; 9] = [
            Arc::new(bash::Bash::BASH),
            Arc::new(view::View),
            Arc::new(write::Write),
            Arc::new(edit::Edit),
            Arc::new(ls::Ls),
            Arc::new(glob::Glob),
            Arc::new(grep::Grep),
            Arc::new(todo::Todo),
            Arc::new(task::Task),
        ];
        Self::from_tools(tools)
    }

    /// A registry of exactly these tools (benchmarks measure the loop with a
    /// no-op tool; a deployment uses [`Registry::standard`]).
    pub fn from_tools(tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        Self::of(tools.into_iter().map(|t| (t.name().to_owned(), t)).collect())
    }

    fn of(tools: BTreeMap<String, Arc<dyn Tool>>) -> Self {
        let specs = tools
            .values()
            .map(|t| ToolSpec { name: t.name().into(), description: t.description().into(), input_schema: t.schema() })
            .collect();
        Registry { tools, specs }
    }

    /// These tools and `extra` (a run's MCP tools); a name already taken
    /// keeps its first tool.
    pub fn with(&self, extra: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        let mut tools = self.tools.clone();
        for tool in extra {
            tools.entry(tool.name().to_owned()).or_insert(tool);
        }
        Self::of(tools)
    }

    /// These tools for a sandbox whose commands run with `shell`: a
    /// built-in `bash` is replaced by one whose description names that
    /// shell (or says there is none). With bash, or without a `bash` tool,
    /// the registry is unchanged.
    pub fn for_shell(&self, shell: Option<kiln_toolbox::protocol::SessionShell>) -> Self {
        let mut tools = self.tools.clone();
        match shell {
            Some(shell) if shell != kiln_toolbox::protocol::SessionShell::Bash && tools.contains_key("bash") => {
                tools.insert("bash".to_owned(), Arc::new(bash::Bash::for_shell(shell)));
            }
            _ => {}
        }
        Self::of(tools)
    }

    /// The tools' definitions, in the order of their names.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The names of the tools, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Runs a call; an unknown tool is the model's mistake, not a failure.
    pub async fn call(&self, ctx: &ToolContext<'_>, name: &str, args: Value) -> Result<ToolOutcome, ToolFailure> {
        match self.get(name) {
            Some(tool) => tool.call(ctx, args).await,
            None => {
                let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
                Ok(ToolOutcome::error(format!("unknown tool {name:?}; available tools: {}", known.join(", "))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_an_object_schema_with_properties() {
        for spec in Registry::standard().specs() {
            assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
            assert!(spec.input_schema["properties"].is_object(), "{}", spec.name);
            assert!(spec.input_schema.get("$schema").is_none());
        }
    }

    #[test]
    fn standard_tools_have_the_documented_names_and_arguments() {
        let registry = Registry::standard();
        let specs = registry.specs();
        let props = |name: &str| {
            let s = specs.iter().find(|s| s.name == name).unwrap();
            let mut keys: Vec<String> = s.input_schema["properties"].as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        assert_eq!(props("bash"), ["command", "timeout_s"]);
        assert_eq!(props("view"), ["limit", "offset", "path"]);
        assert_eq!(props("write"), ["content", "path"]);
        assert_eq!(props("edit"), ["new_string", "old_string", "path", "replace_all"]);
        assert_eq!(props("ls"), ["path"]);
        assert_eq!(props("glob"), ["path", "pattern"]);
        assert_eq!(props("grep"), ["case_insensitive", "context", "include", "literal", "path", "pattern"]);
        assert_eq!(props("todo"), ["items"]);
        assert_eq!(props("task"), ["agent", "description", "prompt"]);
    }

    /// A tool that counts how often its schema is asked for.
    struct Counted(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl Tool for Counted {
        fn name(&self) -> &str {
            "counted"
        }
        fn description(&self) -> &str {
            "counts"
        }
        fn schema(&self) -> Value {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            schema_of::<ls::LsArgs>()
        }
        fn is_mutating(&self) -> bool {
            false
        }
        async fn call(&self, _: &ToolContext<'_>, _: Value) -> Result<ToolOutcome, ToolFailure> {
            Ok(ToolOutcome::error("not called here"))
        }
    }

    #[test]
    fn a_registrys_definitions_are_made_once_and_again_for_a_changed_registry() {
        let counted = Arc::new(Counted(Default::default()));
        let registry = Registry::from_tools([counted.clone() as Arc<dyn Tool>]);
        for _ in 0..3 {
            assert_eq!(registry.specs()[0].name, "counted");
        }
        assert_eq!(counted.0.load(std::sync::atomic::Ordering::SeqCst), 1, "made once, not per step");
        let widened = registry.with([Arc::new(ls::Ls) as Arc<dyn Tool>]);
        let names: Vec<String> = widened.specs().iter().map(|s| s.name.clone()).collect();
        assert_eq!(names, ["counted", "ls"]);
        let sh = Registry::standard().for_shell(Some(kiln_toolbox::protocol::SessionShell::Sh));
        let bash = sh.specs().iter().find(|s| s.name == "bash").unwrap();
        assert!(bash.description.contains("with sh"), "{}", bash.description);
    }
}
