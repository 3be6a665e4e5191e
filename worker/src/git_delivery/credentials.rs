//! `KILN_GIT_CREDENTIALS`: the operator's credentials for `deliver.git`
//! remotes, one per host. A JSON file:
//!
//! ```json
//! { "git.example.com": { "username": "kiln-bot", "token": "…" },
//!   "127.0.0.1:8080":  { "username": "ci", "token": "…" } }
//! ```
//!
//! A key is `host` for the scheme's default port, `host:port` otherwise
//! (`kiln_protocol::deliver::credentials_key`). A remote whose host is not
//! listed is refused before any connection: the operator, not the run,
//! decides where the worker pushes.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// Only the position: the text around a parse error may be a token.
    #[error("KILN_GIT_CREDENTIALS is not a valid credentials file (line {line}, column {column})")]
    Invalid { line: usize, column: usize },
    #[error("KILN_GIT_CREDENTIALS: host {0:?} has an empty username or token")]
    Empty(String),
}

/// One host's credentials. Never printed: `Debug` hides the token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub username: String,
    pub token: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("username", &self.username).field("token", &"<redacted>").finish()
    }
}

impl Credential {
    /// `Authorization` header value of HTTP basic authentication.
    pub fn basic_header(&self) -> String {
        format!("Authorization: Basic {}", BASE64_STANDARD.encode(format!("{}:{}", self.username, self.token)))
    }

    /// The ways the secret could appear in text git printed.
    pub fn secrets(&self) -> Vec<String> {
        let encoded = BASE64_STANDARD.encode(format!("{}:{}", self.username, self.token));
        vec![self.token.clone(), encoded]
    }
}

/// Credentials by host (lower-case `host` or `host:port`).
#[derive(Debug, Clone, Default)]
pub struct GitCredentials {
    hosts: BTreeMap<String, Credential>,
}

impl GitCredentials {
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CredentialsError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        let hosts: BTreeMap<String, Credential> =
            serde_json::from_str(text).map_err(|e| CredentialsError::Invalid { line: e.line(), column: e.column() })?;
        let mut out = BTreeMap::new();
        for (host, cred) in hosts {
            if cred.username.is_empty() || cred.token.is_empty() {
                return Err(CredentialsError::Empty(host));
            }
            out.insert(host.to_ascii_lowercase(), cred);
        }
        Ok(GitCredentials { hosts: out })
    }

    pub fn get(&self, key: &str) -> Option<&Credential> {
        self.hosts.get(&key.to_ascii_lowercase())
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The hosts listed (lower case), without their credentials.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_looked_up_case_insensitively_and_tokens_never_printed() {
        let c = GitCredentials::parse(r#"{"Git.Example.com":{"username":"u","token":"s3cret"}}"#).unwrap();
        let cred = c.get("git.example.com").unwrap();
        assert!(!format!("{cred:?}").contains("s3cret"));
        assert!(c.get("git.example.com:8443").is_none());
        assert_eq!(cred.basic_header(), format!("Authorization: Basic {}", BASE64_STANDARD.encode("u:s3cret")));
    }

    #[test]
    fn a_bad_file_is_refused_without_quoting_it() {
        let e = GitCredentials::parse(r#"{"h":{"username":"u","token":s3cret}}"#).unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(GitCredentials::parse(r#"{"h":{"username":"u","token":""}}"#).is_err());
    }
}
