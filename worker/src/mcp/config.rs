//! The operator's MCP servers: a JSON file named by `KILN_MCP_SERVERS`.
//!
//! ```json
//! { "servers": {
//!     "demo": { "url": "https://mcp.example.com/mcp",
//!               "headers": { "Authorization": "Bearer …" },
//!               "trust_read_only_hints": true,
//!               "timeout_s": 60 },
//!     "repo": { "command": "python3", "args": ["tools/mcp_server.py"],
//!               "env": { "LOG_LEVEL": "info" }, "cwd": "/workspace" } } }
//! ```
//!
//! A server has either a `url` (remote: the worker is the client) or a
//! `command` (in-sandbox: started over stdio inside the session's
//! container, see `stdio`). An in-sandbox server's `env` is visible to
//! everything in the sandbox, so it holds no secrets.
//!
//! A file rather than environment variables: header values are secrets, and
//! a file can be mounted from a secret store with its own permissions,
//! while the worker's environment is readable by everything it starts and
//! is what settings dumps print. Header values are held as
//! [`SecretString`]s (a `Debug` that never shows them) and marked sensitive
//! when they become HTTP headers; only the worker's MCP client sends them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use kiln_protocol::mcp::{self as rules, McpServerSpec};

/// Default of [`ServerConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(rules::DEFAULT_TIMEOUT_S);

/// Every server this worker may connect runs to.
#[derive(Debug, Clone, Default)]
pub struct McpConfig {
    pub servers: BTreeMap<String, ServerConfig>,
    /// Whether a tenant's remote server (an environment's) may be at a
    /// loopback, private or link-local address (`KILN_MCP_ALLOW_PRIVATE`).
    /// The operator's own servers are trusted and not vetted.
    pub allow_private: bool,
}

/// One server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How the worker reaches it.
    pub transport: Transport,
    /// Whether a tool's `readOnlyHint` may make it read-only (parallel,
    /// no approval under `approval: "mutating"`). Off by default: the hint
    /// is the server's word, and a server is not trusted by default.
    pub trust_read_only_hints: bool,
    /// How long a call (and the connection at session start) may take.
    pub timeout: Duration,
}

/// Where a server runs.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A remote server over streamable HTTP.
    Remote(RemoteConfig),
    /// A server started inside the session's sandbox, spoken to over its
    /// stdin and stdout.
    Stdio(StdioConfig),
}

#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The streamable HTTP endpoint (`http` or `https`).
    pub url: url::Url,
    /// Sent with every request to the server: credentials, usually.
    pub headers: Vec<(String, SecretString)>,
    /// A tenant's server: its host is resolved, vetted and pinned before
    /// every connection (see `crate::net_guard`); `Some(allow_private)`.
    /// `None`: the operator's, connected to as configured.
    pub vet: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct StdioConfig {
    /// The program, found on the sandbox's `PATH` or relative to `cwd`.
    pub command: String,
    pub args: Vec<String>,
    /// Added to the sandbox's environment. Not secret: the sandbox sees it.
    pub env: Vec<(String, String)>,
    /// Absolute; `/workspace` by default.
    pub cwd: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("KILN_MCP_SERVERS: {0}")]
    Invalid(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    servers: BTreeMap<String, RawServer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    trust_read_only_hints: bool,
    #[serde(default)]
    timeout_s: Option<u64>,
}

impl McpConfig {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    /// Parses and checks the file's text. Error messages name fields and
    /// servers, never header values.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // serde_json's messages quote no input values for these types' errors
        // beyond field names, but a header value that fails to parse as a
        // string could be echoed: report only the position.
        let file: File = serde_json::from_str(text).map_err(|e| {
            ConfigError::Invalid(format!("not a valid servers file (line {}, column {})", e.line(), e.column()))
        })?;
        let specs: BTreeMap<String, (McpServerSpec, bool)> =
            file.servers.into_iter().map(|(name, raw)| (name, raw.into_spec())).collect();
        let plain: BTreeMap<String, McpServerSpec> =
            specs.iter().map(|(name, (spec, _))| (name.clone(), spec.clone())).collect();
        rules::validate_servers(&plain).map_err(ConfigError::Invalid)?;
        let mut servers = BTreeMap::new();
        for (name, (spec, trust)) in specs {
            let server = ServerConfig::from_spec(spec, trust, None)
                .map_err(|e| ConfigError::Invalid(format!("server {name:?}: {e}")))?;
            servers.insert(name, server);
        }
        Ok(McpConfig { servers, allow_private: false })
    }
}

impl RawServer {
    /// The server as the shared rules see it, and whether to trust its hints.
    fn into_spec(self) -> (McpServerSpec, bool) {
        let spec = McpServerSpec {
            url: self.url,
            headers: (!self.headers.is_empty()).then_some(self.headers),
            command: self.command,
            args: self.args,
            env: self.env,
            cwd: self.cwd,
            timeout_s: self.timeout_s,
        };
        (spec, self.trust_read_only_hints)
    }
}

impl ServerConfig {
    /// A server of a tenant's environment: `spec` (checked when it was
    /// stored or read) with `headers`, the values opened from their seal.
    /// Never trusted for read-only hints, and a remote one is vetted.
    pub fn tenant(spec: McpServerSpec, headers: BTreeMap<String, String>, allow_private: bool) -> Result<Self, String> {
        let spec = McpServerSpec { headers: spec.url.is_some().then_some(headers), ..spec };
        spec.validate()?;
        Self::from_spec(spec, false, Some(allow_private))
    }

    /// `spec`, which passed [`McpServerSpec::validate`].
    fn from_spec(spec: McpServerSpec, trust_read_only_hints: bool, vet: Option<bool>) -> Result<Self, String> {
        let timeout = Duration::from_secs(spec.timeout_s.unwrap_or(rules::DEFAULT_TIMEOUT_S));
        let transport = match (spec.url, spec.command) {
            (Some(url), None) => {
                let url = url::Url::parse(&url).map_err(|e| format!("url: {e}"))?;
                let headers = spec.headers.unwrap_or_default();
                Transport::Remote(RemoteConfig {
                    url,
                    headers: headers.into_iter().map(|(n, v)| (n, SecretString::from(v))).collect(),
                    vet,
                })
            }
            (None, Some(command)) => Transport::Stdio(StdioConfig {
                command,
                args: spec.args,
                env: spec.env.into_iter().collect(),
                cwd: spec.cwd.unwrap_or_else(|| crate::sandbox::WORKSPACE.to_owned()),
            }),
            _ => return Err("give either url (a remote server) or command (one in the sandbox)".into()),
        };
        Ok(ServerConfig { transport, trust_read_only_hints, timeout })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn a_valid_file_parses_with_defaults() {
        let c = McpConfig::parse(
            r#"{"servers":{"demo":{"url":"http://127.0.0.1:9/mcp","headers":{"X-Api-Key":"s3cret"}},
                "other":{"url":"https://x.example/mcp","trust_read_only_hints":true,"timeout_s":5}}}"#,
        )
        .unwrap();
        let demo = &c.servers["demo"];
        let Transport::Remote(remote) = &demo.transport else { panic!("{demo:?}") };
        assert_eq!(remote.url.as_str(), "http://127.0.0.1:9/mcp");
        assert_eq!(remote.headers[0].0, "X-Api-Key");
        assert_eq!(remote.headers[0].1.expose_secret(), "s3cret");
        assert!(!demo.trust_read_only_hints);
        assert_eq!(demo.timeout, DEFAULT_TIMEOUT);
        assert!(c.servers["other"].trust_read_only_hints);
        assert_eq!(c.servers["other"].timeout, Duration::from_secs(5));
        // Debug never shows a header's value.
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn servers_in_the_sandbox_parse_with_workspace_as_their_cwd() {
        let c = McpConfig::parse(
            r#"{"servers":{"repo":{"command":"python3","args":["tools/s.py","-v"],"env":{"LEVEL":"1"}},
                "other":{"command":"srv","cwd":"/tmp","timeout_s":5}}}"#,
        )
        .unwrap();
        let Transport::Stdio(repo) = &c.servers["repo"].transport else { panic!("{c:?}") };
        assert_eq!(repo.command, "python3");
        assert_eq!(repo.args, ["tools/s.py", "-v"]);
        assert_eq!(repo.env, [("LEVEL".to_owned(), "1".to_owned())]);
        assert_eq!(repo.cwd, "/workspace");
        let Transport::Stdio(other) = &c.servers["other"].transport else { panic!("{c:?}") };
        assert_eq!(other.cwd, "/tmp");
        for bad in [
            r#"{"servers":{"a":{}}}"#,
            r#"{"servers":{"a":{"command":"x","url":"http://h/"}}}"#,
            r#"{"servers":{"a":{"command":""}}}"#,
            r#"{"servers":{"a":{"command":"x","cwd":"rel"}}}"#,
            r#"{"servers":{"a":{"command":"x","env":{"1A":"v"}}}}"#,
            r#"{"servers":{"a":{"command":"x","headers":{"X":"v"}}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","args":["x"]}}}"#,
        ] {
            assert!(McpConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_server_name_that_would_make_tool_names_ambiguous_is_refused_by_name() {
        for name in ["github__x", "github_", "_github"] {
            let file = format!(r#"{{"servers":{{"{name}":{{"url":"http://h/"}}}}}}"#);
            let e = McpConfig::parse(&file).unwrap_err().to_string();
            assert!(e.starts_with("KILN_MCP_SERVERS: ") && e.contains(&format!("{name:?}")), "{e}");
        }
        McpConfig::parse(r#"{"servers":{"my_server":{"url":"http://h/"}}}"#).unwrap();
    }

    #[test]
    fn bad_files_are_refused_without_quoting_secrets() {
        let cases = [
            r#"{"servers":{"a b":{"url":"http://h/"}}}"#,
            r#"{"servers":{"a":{"url":"ftp://h/"}}}"#,
            r#"{"servers":{"a":{"url":"http://u:p@h/"}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","headers":{"Bad Name":"v"}}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","headers":{"X":"s3cret\n"}}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","timeout_s":0}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","typo":1}}}"#,
            r#"{"servers":{"a":{"url":"http://h/","headers":{"X":7}}}}"#,
            r#"not json s3cret"#,
        ];
        for case in cases {
            let e = McpConfig::parse(case).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{case}: {e}");
        }
    }
}
