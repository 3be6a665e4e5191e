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

use crate::input;

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
/// Bytes of the command, one argument, one variable's value, the cwd, the
/// url, or one header's value.
pub const MAX_ARG_BYTES: usize = 4096;
/// Where a server in the sandbox starts when no `cwd` is given.
pub const DEFAULT_CWD: &str = "/workspace";

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
    /// without `headers` keeps the ones stored for it.
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
        let timeout_s = self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
        if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
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
            cwd: match &self.command {
                Some(_) => Some(self.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_owned())),
                None => None,
            },
            timeout_s: self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S),
        }
    }

    fn check_stdio(&self, command: &str) -> Result<(), String> {
        if self.headers.as_ref().is_some_and(|h| !h.is_empty()) {
            return Err("headers are for remote servers (url); a server in the sandbox has env".into());
        }
        if command.is_empty() {
            return Err("command must not be empty".into());
        }
        plain("command", command)?;
        if self.args.len() > MAX_ARGS {
            return Err(format!("at most {MAX_ARGS} args"));
        }
        for arg in &self.args {
            plain("args", arg)?;
        }
        if self.env.len() > MAX_ENV {
            return Err(format!("at most {MAX_ENV} env variables"));
        }
        for (name, value) in &self.env {
            let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("env name {name:?}: letters, digits and _, not starting with a digit"));
            }
            plain("env", value)?;
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.starts_with('/') {
                return Err("cwd must be an absolute path".into());
            }
            plain("cwd", cwd)?;
        }
        Ok(())
    }

    fn check_remote(&self, url: &str) -> Result<(), String> {
        if self.command.is_some() || !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
            return Err("args, env and cwd are for servers in the sandbox (command)".into());
        }
        if url.len() > MAX_ARG_BYTES {
            return Err(format!("url: at most {MAX_ARG_BYTES} bytes"));
        }
        // url's messages describe the fault, not the input.
        let parsed = url::Url::parse(url).map_err(|e| format!("url: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err("url must be an http(s) URL with a host".into());
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err("url must not hold credentials; put them in headers".into());
        }
        let headers = self.headers.as_ref().map(BTreeMap::len).unwrap_or(0);
        if headers > MAX_HEADERS {
            return Err(format!("at most {MAX_HEADERS} headers"));
        }
        for (name, value) in self.headers.iter().flatten() {
            if !header_name(name) {
                return Err(format!("header name {name:?} is not a valid HTTP header name"));
            }
            if !header_value(value) {
                return Err(format!("the value of header {name:?} is not a valid HTTP header value"));
            }
        }
        Ok(())
    }
}

/// Checks a set of servers: their count and names, then each.
pub fn validate_servers(servers: &BTreeMap<String, McpServerSpec>) -> Result<(), String> {
    if servers.len() > MAX_SERVERS {
        return Err(format!("at most {MAX_SERVERS} servers"));
    }
    for (name, server) in servers {
        if !input::MCP_SERVER_NAME.accepts(name) {
            return Err(format!(
                "server name {name:?}: 1 to {} letters, digits, _ or -",
                input::MCP_SERVER_NAME.max_chars
            ));
        }
        server.validate().map_err(|e| format!("server {name:?}: {e}"))?;
    }
    Ok(())
}

fn plain(what: &str, text: &str) -> Result<(), String> {
    if text.contains('\0') || text.len() > MAX_ARG_BYTES {
        Err(format!("{what}: at most {MAX_ARG_BYTES} bytes, no NUL"))
    } else {
        Ok(())
    }
}

/// An HTTP header name: one or more token characters (RFC 9110 §5.6.2).
fn header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An HTTP header value: visible characters, spaces and tabs, no line
/// breaks (what `http::HeaderValue::from_str` takes), bounded.
fn header_value(value: &str) -> bool {
    value.len() <= MAX_ARG_BYTES && value.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(json: &str) -> Result<(), String> {
        let servers: BTreeMap<String, McpServerSpec> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        validate_servers(&servers)
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
        ] {
            let e = servers(bad).unwrap_err();
            assert!(!e.contains("s3cret"), "{bad}: {e}");
        }
        let many: BTreeMap<String, McpServerSpec> = (0..=MAX_SERVERS)
            .map(|i| (format!("s{i}"), McpServerSpec { command: Some("x".into()), ..Default::default() }))
            .collect();
        assert!(validate_servers(&many).is_err());
    }
}
