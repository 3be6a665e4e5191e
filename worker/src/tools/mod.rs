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
mod view;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::providers::ToolSpec;
use crate::sandbox::{FileError, Sandbox, SandboxError};

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
}

#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// JSON schema of the arguments object.
    fn schema(&self) -> Value;
    /// Whether the tool changes the workspace (runs serially, may need approval).
    fn is_mutating(&self) -> bool;
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
    tools: BTreeMap<&'static str, Arc<dyn Tool>>,
}

impl Registry {
    pub fn standard() -> Self {
        let tools: [Arc<dyn Tool>; 4] =
            [Arc::new(bash::Bash), Arc::new(view::View), Arc::new(write::Write), Arc::new(edit::Edit)];
        Registry { tools: tools.into_iter().map(|t| (t.name(), t)).collect() }
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .values()
            .map(|t| ToolSpec { name: t.name().into(), description: t.description().into(), input_schema: t.schema() })
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Runs a call; an unknown tool is the model's mistake, not a failure.
    pub async fn call(&self, ctx: &ToolContext<'_>, name: &str, args: Value) -> Result<ToolOutcome, ToolFailure> {
        match self.get(name) {
            Some(tool) => tool.call(ctx, args).await,
            None => {
                let known: Vec<_> = self.tools.keys().copied().collect();
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
        let specs = Registry::standard().specs();
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
    }
}
