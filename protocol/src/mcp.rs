//! MCP servers as a tenant declares them: in an environment (the API's
//! `mcp_servers`) or in `.kiln/environment.toml` (servers in the sandbox
//! only). The rules are the operator's file's too (`KILN_MCP_SERVERS`,
//! read by the worker), so one server is checked alike wherever it is
//! declared.
//!
//! A server has either a `url` (remote: the worker is the client, with the
//! `headers` it was given) or a `command` (started inside the run's
//! sandbox over stdio, with `args`, `env` and `cwd`). Header values are
//! secrets: they go in, only their names come out ([`McpServerView`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::input;
use crate::rules::{Constraint, NO_NUL, Range, Text};

/// Default per-call timeout, in seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 60;
/// Longest per-call timeout, in seconds.
pub const MAX_TIMEOUT_S: u64 = 3_600;
/// Servers one environment (or the operator's file) may name.
pub const MAX_SERVERS: usize = 64;
/// Headers per server.
pub const MAX_HEADERS: usize = 32;
/// Arguments and environment variables of a server in the sandbox.
pub const MAX_ARGS: usize = 64;
pub const MAX_ENV: usize = 64;
/// Characters of the command, one argument, one variable's value, the
/// cwd, or one header's value.
pub const MAX_ARG_CHARS: usize = 4096;
/// Where a server in the sandbox starts when no `cwd` is given.
pub const DEFAULT_CWD: &str = "/workspace";

/// A remote server's URL: `http(s)://host[:port][/path…]`, the host a DNS
/// name (whose last label starts with a letter) or a dotted IPv4 address,
/// no credentials. Narrower than what URL parsers take, so that what the
/// pattern accepts always parses, and the document and the server agree.
pub static URL: Text = Text::new(
    1,
    2048,
    concat!(
        r"^https?://(",
        r"(([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?[.])*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)",
        r"|(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])[.]){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))",
        r")(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?([/?#][A-Za-z0-9._~!$&'()*+,;=:@%/?#-]*)?$"
    ),
);
/// An HTTP header name: token characters (RFC 9110 §5.6.2).
pub static HEADER_NAME: Text = Text::new(1, 256, r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$");
/// An HTTP header value: no control characters but tab (what
/// `http::HeaderValue` takes).
pub static HEADER_VALUE: Text = Text::new(0, MAX_ARG_CHARS, r"^[^\u0000-\u0008\u000A-\u001F\u007F]*$");
/// A server in the sandbox: its command, arguments and variables' values.
pub static COMMAND: Text = Text::new(1, MAX_ARG_CHARS, NO_NUL);
pub static ARG: Text = Text::new(0, MAX_ARG_CHARS, NO_NUL);
/// Absolute.
pub static CWD: Text = Text::new(1, MAX_ARG_CHARS, r"^/[^\u0000]*$");
pub static TIMEOUT_S: Range<u64> = Range::new(1, MAX_TIMEOUT_S);

/// One MCP server of an environment: `url` (and `headers`) for a remote
/// one, `command` (and `args`, `env`, `cwd`) for one in the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// A remote server's streamable HTTP endpoint: `http` or `https`, with
    /// a host, without credentials. The worker connects to it from outside
    /// the sandbox, so its host must resolve to public addresses unless the
    /// deployment sets `KILN_MCP_ALLOW_PRIVATE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Write-only: sent by the worker with every request to a remote
    /// server (credentials, usually); stored encrypted, answered by name
    /// only, never shown to the sandbox or the model. On `PUT`, a server
    /// without `headers` keeps the ones stored for it if its `url` is the
    /// same; a changed `url` drops them (send them again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// A server in the sandbox: the program, on the sandbox's `PATH` or
    /// relative to `cwd`. It runs as the agent's commands do (same limits
    /// and network policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Added to the server's environment in the sandbox: not secret.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Absolute; `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// How long one call (and connecting) may take, 1 to 3600 s; 60 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// An environment's MCP server as the API shows it: header names, never
/// their values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct McpServerView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The names of the stored headers, sorted; their values are never shown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub timeout_s: u64,
}

impl McpServerSpec {
    /// Checks the server. Messages name fields and headers, never a
    /// header's value.
    pub fn validate(&self) -> Result<(), String> {
        if !TIMEOUT_S.contains(self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S)) {
            return Err(format!("timeout_s must be between 1 and {MAX_TIMEOUT_S}"));
        }
        match (&self.url, &self.command) {
            (Some(url), None) => self.check_remote(url),
            (None, Some(command)) => self.check_stdio(command),
            _ => Err("give either url (a remote server) or command (one in the sandbox)".into()),
        }
    }

    /// Whether the server is remote (has a `url`).
    pub fn is_remote(&self) -> bool {
        self.url.is_some()
    }

    /// What the API shows of it; `header_names` are the stored ones.
    pub fn view(&self, header_names: Vec<String>) -> McpServerView {
        McpServerView {
            url: self.url.clone(),
            header_names,
            command: self.command.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            cwd: self.command.as_ref().map(|_| self.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_owned())),
            timeout_s: self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S),
        }
    }

    fn check_stdio(&self, command: &str) -> Result<(), String> {
        if self.headers.as_ref().is_some_and(|h| !h.is_empty()) {
            return Err("headers are for remote servers (url); a server in the sandbox has env".into());
        }
        if !COMMAND.accepts(command) {
            return Err(format!("command: 1 to {MAX_ARG_CHARS} characters, no NUL"));
        }
        if self.args.len() > MAX_ARGS {
            return Err(format!("at most {MAX_ARGS} args"));
        }
        if !self.args.iter().all(|a| ARG.accepts(a)) {
            return Err(format!("args: at most {MAX_ARG_CHARS} characters each, no NUL"));
        }
        if self.env.len() > MAX_ENV {
            return Err(format!("at most {MAX_ENV} env variables"));
        }
        for (name, value) in &self.env {
            if !input::ENV_VAR_NAME.accepts(name) {
                return Err(format!(
                    "env name {name:?}: letters, digits and _, not starting with a digit, at most {} characters",
                    input::ENV_VAR_NAME.max_chars
                ));
            }
            if !ARG.accepts(value) {
                return Err(format!("env: at most {MAX_ARG_CHARS} characters each, no NUL"));
            }
        }
        if self.cwd.as_deref().is_some_and(|cwd| !CWD.accepts(cwd)) {
            return Err(format!("cwd must be an absolute path of at most {MAX_ARG_CHARS} characters, no NUL"));
        }
        Ok(())
    }

    fn check_remote(&self, url: &str) -> Result<(), String> {
        if self.command.is_some() || !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
            return Err("args, env and cwd are for servers in the sandbox (command)".into());
        }
        // The pattern leaves no room for credentials (no '@' before the
        // path); the parser's answer is checked too, in case.
        let parsed = url::Url::parse(url).ok().filter(|u| u.username().is_empty() && u.password().is_none());
        if !URL.accepts(url) || parsed.is_none() {
            if url.split(['/', '?', '#']).nth(2).is_some_and(|authority| authority.contains('@')) {
                return Err("url must not hold credentials; put them in headers".into());
            }
            return Err(format!(
                "url must be an http(s) URL of at most {} characters with a DNS name or IPv4 address as its host \
                 and no credentials",
                URL.max_chars
            ));
        }
        let headers = self.headers.as_ref().map(BTreeMap::len).unwrap_or(0);
        if headers > MAX_HEADERS {
            return Err(format!("at most {MAX_HEADERS} headers"));
        }
        for (name, value) in self.headers.iter().flatten() {
            if !HEADER_NAME.accepts(name) {
                return Err(format!("header name {name:?} is not a valid HTTP header name"));
            }
            if !HEADER_VALUE.accepts(value) {
                return Err(format!("the value of header {name:?} is not a valid HTTP header value"));
            }
        }
        Ok(())
    }
}

/// The JSON Schema of [`McpServerSpec`] as the server checks it: one of a
/// remote server or one in the sandbox, each with its own fields' rules
/// (a field of the other kind may be given only empty or null, as serde
/// reads it).
pub fn server_schema() -> Value {
    json!({
        "description": "One MCP server: `url` (and `headers`) for a remote one, `command` (and `args`, `env`, \
            `cwd`) for one started inside the run's sandbox. `timeout_s` (1 to 3600, 60 when absent) bounds a \
            call and connecting. Never trusted for its tools' `readOnlyHint`: that trust is the operator's.",
        "oneOf": [remote_schema(), sandboxed_schema()]
    })
}

/// A remote server's fields: its url and headers (the sandbox's fields
/// only empty or null).
fn remote_schema() -> Value {
    let mut headers = nullable(string_map(&HEADER_NAME, &HEADER_VALUE, MAX_HEADERS));
    headers["description"] = json!(
        "Write-only: sent by the worker with every request (credentials, usually); stored encrypted, answered by \
         name only (`header_names`), never shown to the sandbox or the model. On `PUT`, absent keeps the ones \
         stored for a remote server of this name at the same url; a changed url drops them."
    );
    let mut url = rule(&URL, "string");
    url["description"] = json!(
        "The streamable HTTP endpoint. The worker connects to it from outside the sandbox: its host must resolve \
         to public addresses unless the deployment sets KILN_MCP_ALLOW_PRIVATE."
    );
    json!({
        "title": "Remote MCP server",
        "type": "object",
        "required": ["url"],
        "additionalProperties": false,
        "properties": {
            "url": url,
            "headers": headers,
            "timeout_s": nullable(rule(&TIMEOUT_S, "integer")),
            "command": {"type": "null"},
            "args": {"type": "array", "maxItems": 0},
            "env": {"type": "object", "maxProperties": 0},
            "cwd": {"type": "null"},
        }
    })
}

/// A server in the sandbox: its command, arguments, environment and
/// directory (the remote fields only empty or null).
fn sandboxed_schema() -> Value {
    let mut args = json!({"type": "array", "maxItems": MAX_ARGS, "items": rule(&ARG, "string")});
    args["description"] = json!("Its arguments.");
    let mut env = string_map(&input::ENV_VAR_NAME, &ARG, MAX_ENV);
    env["description"] = json!("Added to its environment in the sandbox: not secret.");
    let mut cwd = nullable(rule(&CWD, "string"));
    cwd["description"] = json!("Absolute; /workspace when absent.");
    let mut command = rule(&COMMAND, "string");
    command["description"] = json!(
        "The program, on the sandbox's PATH or relative to cwd; it runs as the agent's commands do (same limits \
         and network policy)."
    );
    json!({
        "title": "MCP server in the sandbox",
        "type": "object",
        "required": ["command"],
        "additionalProperties": false,
        "properties": {
            "command": command,
            "args": args,
            "env": env,
            "cwd": cwd,
            "timeout_s": nullable(rule(&TIMEOUT_S, "integer")),
            "url": {"type": "null"},
            "headers": nullable(json!({"type": "object", "maxProperties": 0})),
        }
    })
}

/// A constraint's keywords as a schema of `kind`.
fn rule(c: &dyn Constraint, kind: &str) -> Value {
    let mut k = c.keywords();
    k.insert("type".into(), json!(kind));
    Value::Object(k)
}

/// `schema`, with `null` allowed too.
fn nullable(mut schema: Value) -> Value {
    if let Some(t) = schema.get("type").cloned() {
        schema["type"] = json!([t, "null"]);
    }
    schema
}

/// An object of at most `max` string values, its names and values checked.
fn string_map(names: &dyn Constraint, values: &dyn Constraint, max: usize) -> Value {
    let mut k = Map::new();
    k.insert("type".into(), json!("object"));
    k.insert("maxProperties".into(), json!(max));
    k.insert("propertyNames".into(), Value::Object(names.keywords()));
    k.insert("additionalProperties".into(), rule(values, "string"));
    Value::Object(k)
}

/// The keywords of an environment's `mcp_servers` map: its size and names.
pub struct ServersMap;

impl Constraint for ServersMap {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = Map::new();
        k.insert("maxProperties".into(), json!(MAX_SERVERS));
        k.insert("propertyNames".into(), Value::Object(input::MCP_SERVER_NAME.keywords()));
        k
    }
}

/// Checks a set of servers: their count and names, then each.
pub fn validate_servers(servers: &BTreeMap<String, McpServerSpec>) -> Result<(), String> {
    if servers.len() > MAX_SERVERS {
        return Err(format!("at most {MAX_SERVERS} servers"));
    }
    for (name, server) in servers {
        check_server_name(name)?;
        server.validate().map_err(|e| format!("server {name:?}: {e}"))?;
    }
    Ok(())
}

/// Checks a server's name ([`input::MCP_SERVER_NAME`]): wherever a server
/// is declared, and again where a stored one is used (rows stored before
/// the rule).
pub fn check_server_name(name: &str) -> Result<(), String> {
    if input::MCP_SERVER_NAME.accepts(name) {
        return Ok(());
    }
    Err(format!(
        "server name {name:?}: 1 to {} characters, {}",
        input::MCP_SERVER_NAME.max_chars,
        input::MCP_SERVER_NAME_RULE
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(json: &str) -> Result<(), String> {
        let servers: BTreeMap<String, McpServerSpec> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        validate_servers(&servers)
    }

    #[test]
    fn server_names_leave_the_first_double_underscore_to_the_separator() {
        for good in ["github", "my_server", "a-b_c-d", "a_b_c", "A1", "-x-", "x"] {
            check_server_name(good).unwrap();
        }
        for bad in ["github__x", "github_", "_github", "a___b", "__", "_", "", "a b", "a.b", &"a".repeat(65)] {
            let e = check_server_name(bad).unwrap_err();
            assert!(e.contains("no \"__\""), "{bad}: {e}");
        }
        // What the document states is what the server checks.
        let pattern = regex::Regex::new(input::MCP_SERVER_NAME.pattern.source()).unwrap();
        assert!(pattern.is_match("my_server") && !pattern.is_match("github__x") && !pattern.is_match("github_"));
    }

    #[test]
    fn good_servers_pass_and_bad_ones_are_refused_without_their_secrets() {
        servers(r#"{"demo":{"url":"https://x.example/mcp","headers":{"Authorization":"Bearer s3cret"}}}"#).unwrap();
        servers(r#"{"repo":{"command":"python3","args":["s.py"],"env":{"A":"1"},"cwd":"/tmp","timeout_s":5}}"#)
            .unwrap();
        for bad in [
            r#"{"a b":{"url":"http://h/"}}"#,
            r#"{"a":{}}"#,
            r#"{"a":{"url":"http://h/","command":"x"}}"#,
            r#"{"a":{"url":"ftp://h/"}}"#,
            r#"{"a":{"url":"http://u:s3cret@h/"}}"#,
            r#"{"a":{"url":"http://h/","headers":{"Bad Name":"s3cret"}}}"#,
            r#"{"a":{"url":"http://h/","headers":{"X":"s3cret\n"}}}"#,
            r#"{"a":{"url":"http://h/","timeout_s":0}}"#,
            r#"{"a":{"url":"http://h/","args":["x"]}}"#,
            r#"{"a":{"command":""}}"#,
            r#"{"a":{"command":"x","cwd":"rel"}}"#,
            r#"{"a":{"command":"x","env":{"1A":"v"}}}"#,
            r#"{"a":{"command":"x","headers":{"X":"s3cret"}}}"#,
            r#"{"a":{"url":"http://h/","typo":1}}"#,
            r#"{"github__x":{"command":"x"}}"#,
            r#"{"github_":{"command":"x"}}"#,
            r#"{"_github":{"command":"x"}}"#,
        ] {
            let e = servers(bad).unwrap_err();
            assert!(!e.contains("s3cret"), "{bad}: {e}");
        }
        // Every pattern compiles (one that does not matches nothing).
        for url in ["http://127.0.0.1:65535/mcp", "https://a-b.example.com/x?y=1#z", "http://localhost"] {
            assert!(URL.accepts(url), "{url}");
            assert!(url::Url::parse(url).is_ok(), "{url}");
        }
        for url in ["http://1.2.3.999/", "http://h:65536/", "http://u@h/", "http://h /", "http://[::1]/"] {
            assert!(!URL.accepts(url), "{url}");
        }
        assert!(HEADER_NAME.accepts("X-Api-Key") && HEADER_VALUE.accepts("Bearer a\tb") && CWD.accepts("/w"));
        assert!(COMMAND.accepts("x") && ARG.accepts(""));
        let many: BTreeMap<String, McpServerSpec> = (0..=MAX_SERVERS)
            .map(|i| (format!("s{i}"), McpServerSpec { command: Some("x".into()), ..Default::default() }))
            .collect();
        assert!(validate_servers(&many).is_err());
    }
}
