//! Puts the server's input rules on the document: each field and parameter
//! a client sends gets the JSON Schema keywords of the rule its handler
//! checks it with ([`kiln_protocol::rules`]). The rules are the same values,
//! not copies, so the document cannot promise more or less than the server
//! accepts.

use kiln_protocol::input;
use kiln_protocol::rules::Constraint;
use serde_json::{Map, Value};

use crate::routes::{events, runs, webhooks};

/// `variables` and `secrets` of an environment: their names and values.
static ENV_MAP: input::EnvMap = input::EnvMap;

/// `mcp_servers` of an environment: how many, and their names.
static MCP_SERVERS_MAP: kiln_protocol::mcp::ServersMap = kiln_protocol::mcp::ServersMap;

/// Where a rule goes.
enum Target {
    /// `components.schemas.<schema>`, then a JSON pointer below it.
    Schema(&'static str, &'static str),
    /// The parameter `name` of `method path`.
    Parameter(&'static str, &'static str, &'static str),
}

use Target::{Parameter, Schema};

static RULES: &[(Target, &dyn Constraint)] = &[
    (Schema("CreateRun", "/properties/prompt"), &input::PROMPT),
    (Schema("CreateRun", "/properties/allowed_tools"), &input::ALLOWED_TOOLS),
    (Schema("CreateRun", "/properties/allowed_tools/items"), &input::TOOL_NAME),
    (Schema("CreateRun", "/properties/mcp"), &input::MCP_SERVERS),
    (Schema("CreateRun", "/properties/mcp/items"), &input::MCP_SERVER_NAME),
    (Schema("CreateRun", "/properties/agents"), &input::AGENTS),
    (Schema("CreateRun", "/properties/agents/items"), &input::AGENT_KIND_NAME),
    (Schema("CreateRun", "/properties/callback_url"), &input::CALLBACK_URL),
    (Schema("CreateRun", "/properties/attempts"), &input::ATTEMPTS),
    (Schema("CreateRun", "/properties/attempt_models"), &input::ATTEMPT_MODELS),
    (Schema("CreateRun", "/properties/attempt_models/items"), &input::MODEL_NAME),
    (Schema("GroupLimits", "/properties/max_steps"), &input::MAX_STEPS),
    (Schema("GroupLimits", "/properties/max_tokens"), &input::RUN_MAX_TOKENS),
    (Schema("GroupLimits", "/properties/max_cost_usd"), &input::MAX_COST_USD),
    (Schema("SelectAttempt", "/properties/attempt"), &input::ATTEMPTS),
    (Schema("GitDelivery", "/properties/url"), &input::CALLBACK_URL),
    (Schema("GitDelivery", "/properties/branch"), &input::DELIVER_BRANCH),
    (Schema("GitDelivery", "/properties/author_name"), &input::DELIVER_AUTHOR),
    (Schema("GitDelivery", "/properties/author_email"), &input::DELIVER_AUTHOR),
    (Schema("GitDelivery", "/properties/message"), &input::DELIVER_MESSAGE),
    (Schema("Limits", "/properties/max_steps"), &input::MAX_STEPS),
    (Schema("Limits", "/properties/timeout_s"), &input::TIMEOUT_S),
    (Schema("Limits", "/properties/max_tokens"), &input::RUN_MAX_TOKENS),
    (Schema("Limits", "/properties/max_cost_usd"), &input::MAX_COST_USD),
    (Schema("RepoSpec", "/properties/url"), &input::REPO_URL),
    (Schema("RepoSpec", "/properties/ref"), &input::GIT_REF),
    (Schema("ModelSpec", "/properties/provider"), &input::MODEL_PROVIDER),
    (Schema("ModelSpec", "/properties/name"), &input::MODEL_NAME),
    (Schema("ModelSpec", "/properties/max_tokens"), &input::MODEL_MAX_TOKENS),
    (Schema("ModelSpec", "/properties/temperature"), &input::TEMPERATURE),
    (Schema("ModelSpec", "/properties/context_window"), &input::CONTEXT_WINDOW),
    (Schema("SandboxSpec", "/properties/memory_mb"), &input::SANDBOX_MEMORY_MB),
    (Schema("SandboxSpec", "/properties/cpus"), &input::SANDBOX_CPUS),
    (Schema("SandboxSpec", "/properties/pids"), &input::SANDBOX_PIDS),
    (Schema("HostRule", "/properties/host"), &input::EGRESS_HOST),
    (Schema("HostRule", "/properties/ports/items"), &input::EGRESS_PORT),
    (Schema("HostRule", "/properties/methods/items"), &input::EGRESS_METHOD),
    (Schema("HostRule", "/properties/path_prefixes/items"), &input::EGRESS_PATH_PREFIX),
    (Schema("CreateRun", "/properties/environment"), &input::ENVIRONMENT_NAME),
    (Schema("EnvironmentSpec", "/properties/name"), &input::ENVIRONMENT_NAME),
    (Schema("EnvironmentSpec", "/properties/image"), &input::IMAGE),
    (Schema("EnvironmentSpec", "/properties/setup_script"), &input::SCRIPT),
    (Schema("EnvironmentSpec", "/properties/maintenance_script"), &input::SCRIPT),
    (Schema("EnvironmentSpec", "/properties/variables"), &ENV_MAP),
    (Schema("EnvironmentSpec", "/properties/secrets"), &ENV_MAP),
    (Schema("EnvironmentSpec", "/properties/lock_files"), &input::LOCK_FILES),
    (Schema("EnvironmentSpec", "/properties/lock_files/items"), &input::LOCK_GLOB),
    (Schema("EnvironmentSpec", "/properties/mcp_servers"), &MCP_SERVERS_MAP),
    (Parameter("/v1/environments/{name}", "get", "name"), &input::ENVIRONMENT_NAME),
    (Parameter("/v1/environments/{name}", "put", "name"), &input::ENVIRONMENT_NAME),
    (Parameter("/v1/environments/{name}", "delete", "name"), &input::ENVIRONMENT_NAME),
    (Parameter("/v1/environments/{name}/reset-cache", "post", "name"), &input::ENVIRONMENT_NAME),
    (Schema("SendMessage", "/properties/text"), &input::PROMPT),
    (Schema("Decide", "/properties/reason"), &input::DECISION_REASON),
    (Parameter("/v1/runs/{id}/approvals/{call_id}", "post", "call_id"), &input::CALL_ID),
    (Parameter("/v1/runs", "post", "Idempotency-Key"), &runs::IDEMPOTENCY_KEY),
    (Parameter("/v1/runs", "get", "limit"), &runs::PAGE),
    (Parameter("/v1/runs", "get", "cursor"), &runs::CURSOR),
    (Parameter("/v1/runs/{id}/events", "get", "after"), &events::RESUME),
    (Parameter("/v1/runs/{id}/events", "get", "Last-Event-ID"), &events::RESUME),
    (Parameter("/v1/runs/{id}/events", "get", "limit"), &events::PAGE),
    (Parameter("/v1/webhooks/github", "post", "X-GitHub-Delivery"), &webhooks::DELIVERY_ID),
    (Parameter("/v1/webhooks/github", "post", "X-GitHub-Event"), &webhooks::EVENT_NAME),
];

#[derive(Debug, thiserror::Error)]
#[error("no {0} in the derived document to put its rule on")]
pub struct MissingTarget(String);

pub fn apply(doc: &mut Value) -> Result<(), MissingTarget> {
    // An MCP server is one of two shapes with rules of their own, which a
    // derive cannot say: the protocol states its schema whole.
    let server = doc
        .pointer_mut("/components/schemas/McpServerSpec")
        .ok_or_else(|| MissingTarget("schema McpServerSpec".into()))?;
    *server = kiln_protocol::mcp::server_schema();
    for (target, rule) in RULES {
        let schema = match target {
            Schema(name, pointer) => doc.pointer_mut(&format!("/components/schemas/{name}{pointer}")),
            Parameter(path, method, name) => parameter(doc, path, method, name),
        }
        .and_then(Value::as_object_mut)
        .ok_or_else(|| MissingTarget(describe(target)))?;
        if let Parameter(..) = target {
            not_null(schema);
        }
        merge(schema, rule.keywords());
    }
    Ok(())
}

/// utoipa types an optional parameter as "this or null"; but a header or
/// a query parameter is absent or has a value, and `null` is not one.
fn not_null(schema: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            schema.insert("type".into(), only);
        }
    }
}

fn parameter<'a>(doc: &'a mut Value, path: &str, method: &str, name: &str) -> Option<&'a mut Value> {
    doc.get_mut("paths")?
        .get_mut(path)?
        .get_mut(method)?
        .get_mut("parameters")?
        .as_array_mut()?
        .iter_mut()
        .find(|p| p["name"] == name)?
        .get_mut("schema")
}

/// The rule's keywords replace the derived ones (utoipa's `minimum: 0` of
/// an unsigned integer, say). A field that may be null keeps null in its
/// `enum`.
fn merge(schema: &mut Map<String, Value>, keywords: Map<String, Value>) {
    let nullable = schema.get("type").and_then(Value::as_array).is_some_and(|t| t.iter().any(|t| t == "null"));
    if keywords.contains_key("exclusiveMinimum") {
        schema.remove("minimum");
    }
    for (key, mut value) in keywords {
        if let (true, "enum", Value::Array(values)) = (nullable, key.as_str(), &mut value) {
            values.push(Value::Null);
        }
        schema.insert(key, value);
    }
}

fn describe(target: &Target) -> String {
    match target {
        Schema(name, pointer) => format!("schema {name}{pointer}"),
        Parameter(path, method, name) => format!("parameter {name} of {method} {path}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_rule_lands_on_the_document() {
        let doc = crate::openapi::document().unwrap();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(schemas["CreateRun"]["properties"]["prompt"]["maxLength"], json!(input::MAX_PROMPT_CHARS));
        let provider = &schemas["ModelSpec"]["properties"]["provider"];
        assert_eq!(provider["enum"], json!(["openai", "openai-responses", "anthropic", null]));
        assert_eq!(schemas["Limits"]["properties"]["max_steps"]["minimum"], json!(1));
        let cost = &schemas["Limits"]["properties"]["max_cost_usd"];
        assert_eq!((cost.get("minimum"), &cost["exclusiveMinimum"]), (None, &json!(0.0)));
    }

    #[test]
    fn a_rule_whose_target_is_gone_is_an_error() {
        let mut doc = crate::openapi::document().unwrap();
        doc["components"]["schemas"]["Decide"]["properties"].as_object_mut().unwrap().remove("reason");
        let error = apply(&mut doc).unwrap_err().to_string();
        assert!(error.contains("Decide/properties/reason"), "{error}");
    }
}
