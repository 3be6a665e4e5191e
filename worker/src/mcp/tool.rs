//! One MCP tool as the agent loop sees it: a [`Tool`] like the built-in
//! ones, so it goes through the same registry, `allowed_tools`, approval
//! gate, batching, budgets and events.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::result;
use super::server::Server;
use crate::tools::{Tool, ToolContext, ToolFailure, ToolOutcome};

/// Characters of a tool's description the model is shown.
const MAX_DESCRIPTION_CHARS: usize = 2_000;

pub struct McpTool {
    /// What the model calls it (`mcp__<server>__<tool>`, see `names`).
    name: String,
    /// What the server calls it.
    remote_name: String,
    description: String,
    schema: Value,
    /// Read-only by the server's `readOnlyHint`, when the operator trusts
    /// the server's hints; otherwise it counts as changing things.
    read_only: bool,
    server: Arc<Server>,
}

impl McpTool {
    pub fn new(name: String, listed: &rmcp::model::Tool, server: Arc<Server>) -> Self {
        let hint = listed.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true);
        let read_only = hint && server.config().trust_read_only_hints;
        let told = listed.description.as_deref().or(listed.title.as_deref()).unwrap_or("");
        let description = format!(
            "{} (tool {:?} of the MCP server {:?})",
            told.chars().take(MAX_DESCRIPTION_CHARS).collect::<String>(),
            listed.name,
            server.name()
        );
        McpTool {
            name,
            remote_name: listed.name.to_string(),
            description,
            schema: normalise_schema(&listed.input_schema),
            read_only,
            server,
        }
    }

    /// What the server calls it.
    pub fn remote_name(&self) -> &str {
        &self.remote_name
    }
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn schema(&self) -> Value {
        self.schema.clone()
    }
    fn is_mutating(&self) -> bool {
        !self.read_only
    }
    fn mcp_origin(&self) -> Option<kiln_store::McpCall<'_>> {
        Some(kiln_store::McpCall { server: self.server.name(), tool: &self.remote_name })
    }
    async fn call(&self, _ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Ok(ToolOutcome::error(format!(
                    "invalid arguments for {}: expected an object, got {other}",
                    self.name
                )));
            }
        };
        // Whatever the server does, it is a result the model sees: the run
        // goes on without it.
        Ok(match self.server.call(&self.remote_name, arguments).await {
            Ok(answer) => result::outcome(answer),
            Err(e) => ToolOutcome::error(result::cap(e.to_string())),
        })
    }
}

/// The server's input schema as the providers take it: an object schema
/// with `properties`, without `$schema`.
fn normalise_schema(schema: &Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    schema.remove("$schema");
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return serde_json::json!({"type": "object", "properties": {}});
    }
    if !schema.get("properties").is_some_and(Value::is_object) {
        schema.insert("properties".into(), Value::Object(Map::new()));
    }
    Value::Object(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_become_object_schemas_with_properties() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            normalise_schema(&obj(json!({"$schema": "x", "type": "object"}))),
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(normalise_schema(&obj(json!({"type": "string"}))), json!({"type": "object", "properties": {}}));
        let kept = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        assert_eq!(normalise_schema(&obj(kept.clone())), kept);
    }
}
