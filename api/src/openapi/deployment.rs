//! The document as one deployment serves it: what this deployment refuses
//! whatever the request (a setting it lacks) is left out or stated as
//! refused, so that a client generated from the document never sends it,
//! and what it restricts (the agent kinds, the repository protocols) is
//! stated.
//!
//! The document built from the code ([`super::document`]) describes every
//! feature; each deployment serves a copy without the ones it has switched
//! off: `/metrics` without `KILN_METRICS_TOKEN` (404 on this listener), the
//! GitHub webhook without its secret (404), `GET /v1/callback-key` without
//! `KILN_CALLBACK_SECRET` (404) and then `callback_url` only `null`,
//! environments' `secrets` and remote MCP servers' `headers` only empty
//! without `KILN_SECRETS_KEY` (anything else is 422), and `repo.url` of
//! http(s) and `file://` only without `KILN_ALLOW_GIT_PROTOCOLS`.

use kiln_protocol::input;
use kiln_protocol::rules::Constraint;
use serde_json::{Value, json};

use crate::AppState;

/// What one deployment has switched on.
pub struct Deployment<'a> {
    pub metrics_token: bool,
    pub github_webhooks: bool,
    pub callbacks: bool,
    pub secrets: bool,
    pub git_protocols: bool,
    pub agent_kinds: &'a kiln_protocol::agents::AgentKinds,
    /// `KILN_MAX_ATTEMPTS`: the most `attempts` a run may ask for.
    pub max_attempts: u32,
}

impl<'a> Deployment<'a> {
    pub fn of(state: &'a AppState) -> Self {
        let settings = &state.settings;
        Deployment {
            metrics_token: settings.metrics_token.is_some(),
            github_webhooks: state.github.is_some(),
            callbacks: settings.callback_secret.is_some(),
            secrets: settings.secrets_key.is_some(),
            git_protocols: settings.repo_rules.allow_git_protocols,
            agent_kinds: &settings.agent_kinds,
            max_attempts: settings.max_attempts,
        }
    }

    /// Rewrites `doc` (the full document) for this deployment.
    pub fn tailor(&self, doc: &mut Value) {
        if !self.metrics_token {
            remove_at(doc, "/paths", "/metrics");
            remove_at(doc, "/components/securitySchemes", super::METRICS_TOKEN);
        }
        if !self.github_webhooks {
            remove_at(doc, "/paths", "/v1/webhooks/github");
        }
        if !self.callbacks {
            remove_at(doc, "/paths", "/v1/callback-key");
            refuse(doc, "/components/schemas/CreateRun/properties/callback_url", only_null(), "KILN_CALLBACK_SECRET");
        }
        if !self.secrets {
            refuse(doc, "/components/schemas/EnvironmentSpec/properties/secrets", only_empty(), "KILN_SECRETS_KEY");
            if let Some(shapes) =
                doc.pointer_mut("/components/schemas/McpServerSpec/oneOf").and_then(Value::as_array_mut)
            {
                for shape in shapes.iter_mut().filter(|s| s["title"] == "Remote MCP server") {
                    refuse(shape, "/properties/headers", only_empty(), "KILN_SECRETS_KEY");
                }
            }
        }
        if !self.git_protocols
            && let Some(url) =
                doc.pointer_mut("/components/schemas/RepoSpec/properties/url").and_then(Value::as_object_mut)
        {
            url.extend(input::REPO_URL_WEB.keywords());
        }
        // A run's `agents` may name only this deployment's kinds
        // (`KILN_AGENT_KINDS`): a client reading the document knows which
        // names are refused.
        if let Some(items) =
            doc.pointer_mut("/components/schemas/CreateRun/properties/agents/items").and_then(Value::as_object_mut)
        {
            let names: Vec<Value> = self.agent_kinds.names().map(|n| Value::String(n.to_owned())).collect();
            items.insert("enum".into(), Value::Array(names));
        }
        // And as many attempts as it allows (`KILN_MAX_ATTEMPTS`).
        if let Some(attempts) =
            doc.pointer_mut("/components/schemas/CreateRun/properties/attempts").and_then(Value::as_object_mut)
        {
            attempts.insert("maximum".into(), Value::from(self.max_attempts));
        }
    }
}

fn remove_at(doc: &mut Value, pointer: &str, key: &str) {
    if let Some(object) = doc.pointer_mut(pointer).and_then(Value::as_object_mut) {
        object.remove(key);
    }
}

/// Replaces the schema at `pointer` with `only` (what the server still
/// accepts there), saying which setting would allow more.
fn refuse(doc: &mut Value, pointer: &str, mut only: Value, setting: &str) {
    let Some(schema) = doc.pointer_mut(pointer) else { return };
    only["description"] = json!(format!("Not available on this deployment (it has no {setting})."));
    *schema = only;
}

fn only_null() -> Value {
    json!({"type": "null"})
}

fn only_empty() -> Value {
    json!({"type": ["object", "null"], "maxProperties": 0})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(on: bool, kinds: &kiln_protocol::agents::AgentKinds) -> Deployment<'_> {
        Deployment {
            metrics_token: on,
            github_webhooks: on,
            callbacks: on,
            secrets: on,
            git_protocols: on,
            agent_kinds: kinds,
            max_attempts: input::ATTEMPTS.max,
        }
    }

    #[test]
    fn a_bare_deployment_serves_no_feature_it_lacks() {
        let full = super::super::document().unwrap();
        let kinds = kiln_protocol::agents::AgentKinds::default();
        let mut doc = full.clone();
        with(false, &kinds).tailor(&mut doc);
        for path in ["/metrics", "/v1/webhooks/github", "/v1/callback-key"] {
            assert!(full["paths"].get(path).is_some(), "{path} is in the full document");
            assert!(doc["paths"].get(path).is_none(), "{path} is left out");
        }
        let schemas = &doc["components"]["schemas"];
        assert_eq!(schemas["CreateRun"]["properties"]["callback_url"]["type"], "null");
        assert_eq!(schemas["EnvironmentSpec"]["properties"]["secrets"]["maxProperties"], 0);
        let remote = &schemas["McpServerSpec"]["oneOf"][0];
        assert_eq!(remote["title"], "Remote MCP server");
        assert_eq!(remote["properties"]["headers"]["maxProperties"], 0);
        assert_eq!(schemas["RepoSpec"]["properties"]["url"]["pattern"], input::REPO_URL_WEB.keywords()["pattern"]);
        // Everything else stays.
        assert_eq!(doc["paths"]["/v1/runs"], full["paths"]["/v1/runs"]);
    }

    #[test]
    fn a_deployment_with_every_feature_serves_the_whole_document() {
        let full = super::super::document().unwrap();
        let kinds = kiln_protocol::agents::AgentKinds::default();
        let mut doc = full.clone();
        with(true, &kinds).tailor(&mut doc);
        // The one addition: the names a run's `agents` may hold.
        let agents = "/components/schemas/CreateRun/properties/agents/items";
        let listed = doc.pointer_mut(agents).and_then(Value::as_object_mut).unwrap().remove("enum");
        assert_eq!(listed, Some(json!(["explore", "general"])));
        assert_eq!(doc["paths"], full["paths"]);
        for schema in ["CreateRun", "EnvironmentSpec", "McpServerSpec", "RepoSpec"] {
            assert_eq!(doc["components"]["schemas"][schema], full["components"]["schemas"][schema], "{schema}");
        }
    }
}
