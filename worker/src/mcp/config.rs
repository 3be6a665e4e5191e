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

use kiln_protocol::input;

/// Default of [`ServerConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest per-call timeout an operator may set.
const MAX_TIMEOUT_S: u64 = 3_600;
/// Servers one deployment may name.
const MAX_SERVERS: usize = 64;
/// Headers per server.
const MAX_HEADERS: usize = 32;
/// Arguments and environment variables of an in-sandbox server.
const MAX_ARGS: usize = 64;
const MAX_ENV: usize = 64;
/// Bytes of the command, one argument, one variable's value or the cwd.
const MAX_ARG_BYTES: usize = 4096;

/// Every server this worker may connect runs to.
#[derive(Debug, Clone, Default)]
pub struct McpConfig {
    pub servers: BTreeMap<String, ServerConfig>,
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
        if file.servers.len() > MAX_SERVERS {
            return Err(ConfigError::Invalid(format!("at most {MAX_SERVERS} servers")));
        }
        let mut servers = BTreeMap::new();
        for (name, raw) in file.servers {
            if !input::MCP_SERVER_NAME.accepts(&name) {
                return Err(ConfigError::Invalid(format!(
                    "server name {name:?}: 1 to {} letters, digits, _ or -",
                    input::MCP_SERVER_NAME.max_chars
                )));
            }
            let server = raw.check().map_err(|e| ConfigError::Invalid(format!("server {name:?}: {e}")))?;
            servers.insert(name, server);
        }
        Ok(McpConfig { servers })
    }
}

impl RawServer {
    fn check(self) -> Result<ServerConfig, String> {
        let timeout_s = self.timeout_s.unwrap_or(DEFAULT_TIMEOUT.as_secs());
        if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
            return Err(format!("timeout_s must be between 1 and {MAX_TIMEOUT_S}"));
        }
        let trust_read_only_hints = self.trust_read_only_hints;
        let transport = match (self.url.is_some(), self.command.is_some()) {
            (true, false) => Transport::Remote(self.check_remote()?),
            (false, true) => Transport::Stdio(self.check_stdio()?),
            _ => return Err("give either url (a remote server) or command (one in the sandbox)".into()),
        };
        Ok(ServerConfig { transport, trust_read_only_hints, timeout: Duration::from_secs(timeout_s) })
    }

    fn check_stdio(self) -> Result<StdioConfig, String> {
        if !self.headers.is_empty() {
            return Err("headers are for remote servers (url); a server in the sandbox has env".into());
        }
        let command = self.command.unwrap_or_default();
        let plain = |what: &str, text: &str| {
            if text.contains('\0') || text.len() > MAX_ARG_BYTES {
                Err(format!("{what}: at most {MAX_ARG_BYTES} bytes, no NUL"))
            } else {
                Ok(())
            }
        };
        if command.is_empty() {
            return Err("command must not be empty".into());
        }
        plain("command", &command)?;
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
        let cwd = self.cwd.unwrap_or_else(|| crate::sandbox::WORKSPACE.to_owned());
        if !cwd.starts_with('/') {
            return Err("cwd must be an absolute path".into());
        }
        plain("cwd", &cwd)?;
        Ok(StdioConfig { command, args: self.args, env: self.env.into_iter().collect(), cwd })
    }

    fn check_remote(self) -> Result<RemoteConfig, String> {
        if self.command.is_some() || !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
            return Err("args, env and cwd are for servers in the sandbox (command)".into());
        }
        let url = url::Url::parse(self.url.as_deref().unwrap_or_default()).map_err(|e| format!("url: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err("url must be an http(s) URL with a host".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("url must not hold credentials; put them in headers".into());
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(format!("at most {MAX_HEADERS} headers"));
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in self.headers {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("header name {name:?} is not a valid HTTP header name"));
            }
            if reqwest::header::HeaderValue::from_str(&value).is_err() {
                return Err(format!("the value of header {name:?} is not a valid HTTP header value"));
            }
            headers.push((name, SecretString::from(value)));
        }
        Ok(RemoteConfig { url, headers })
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
