//! Environments: how a repository's sandbox is prepared before the agent
//! starts (an image, a setup script, variables and secrets), owned by a
//! subject and named by runs (`"environment": "name"`).
//!
//! What a client sends ([`EnvironmentSpec`]) and what it gets back
//! ([`Environment`]): secrets go in, only their names come out.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::input;
use crate::mcp::{McpServerSpec, McpServerView};
use crate::run::SandboxSpec;

/// Lock files that key the cache when an environment names none: what the
/// common package managers write.
pub const DEFAULT_LOCK_FILES: &[&str] = &[
    "Cargo.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "pnpm-lock.yaml",
    "yarn.lock",
    "bun.lockb",
    "uv.lock",
    "poetry.lock",
    "Pipfile.lock",
    "requirements*.txt",
    "go.sum",
    "Gemfile.lock",
    "composer.lock",
    "mix.lock",
    "pubspec.lock",
    "flake.lock",
];

/// Body of `POST /v1/environments` and `PUT /v1/environments/{name}`.
/// Unknown fields are refused, as in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSpec {
    /// Lower-case letters, digits, `.`, `_` and `-`; unique per subject.
    pub name: String,
    /// The image setup starts from, by name (`repository[:tag]` or
    /// `repository@digest`), one the deployment allows
    /// (`KILN_ENVIRONMENT_IMAGES`); never an image id or id prefix, nor a
    /// prepared `kiln-env` image. The deployment's sandbox image
    /// (`KILN_SANDBOX_IMAGE`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Run by `bash` as the sandbox user in `/workspace` at the run's base
    /// commit, with `variables` and `secrets` in its environment.
    #[serde(default)]
    pub setup_script: String,
    /// Run on every reuse of a prepared sandbox, after the run's commit is
    /// checked out; with `variables`, never `secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_script: Option<String>,
    /// Plain variables: in the setup and maintenance scripts' environment
    /// and the agent's commands'.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// Write-only: in the setup script's environment only; stored
    /// encrypted, never returned. On `PUT`, absent keeps the stored ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<BTreeMap<String, String>>,
    /// Globs (relative to the repository's root) of the files whose
    /// contents key the cache; [`DEFAULT_LOCK_FILES`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_files: Option<Vec<String>>,
    /// The setup phase's sandbox: limits and network (`bridge` needs a
    /// deployment with `KILN_SANDBOX_ALLOW_NETWORK`).
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub setup_sandbox: Option<SandboxSpec>,
    /// MCP servers the environment's runs get besides the operator's
    /// (a run's `mcp` narrows them all; a name the operator also uses is
    /// the operator's server). Header values are write-only, stored
    /// encrypted (`KILN_SECRETS_KEY`). Never trusted for `readOnlyHint`
    /// (that trust is the operator's to give): their tools are mutating.
    /// Not part of the cache key: changing them keeps prepared sandboxes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
}

/// An environment as the API shows it: no secret values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Environment {
    pub id: Uuid,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub setup_script: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_script: Option<String>,
    pub variables: BTreeMap<String, String>,
    /// The names of the stored secrets, sorted; their values are never shown.
    pub secret_names: Vec<String>,
    /// The globs in force (the default list when none were given).
    pub lock_files: Vec<String>,
    #[serde(default)]
    pub setup_sandbox: SandboxSpec,
    /// Raised by `POST /v1/environments/{name}/reset-cache`: part of the
    /// cache key, so every prepared sandbox made before it misses.
    pub cache_generation: i64,
    /// The environment's MCP servers: header names only.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerView>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Why an environment is not acceptable. Messages are shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentError {
    #[error(
        "name must be {} to {} characters: lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
        input::ENVIRONMENT_NAME.min_chars,
        input::ENVIRONMENT_NAME.max_chars
    )]
    Name,
    #[error(
        "image must be an image name of at most {} characters, `repository[:tag]` or `repository@sha256:<digest>` \
         (never an image id or id prefix, nor one of Kiln's own images)",
        input::IMAGE.text.max_chars
    )]
    Image,
    #[error("{0} is {1} characters; the limit is {max} characters, without NUL", max = input::SCRIPT.max_chars)]
    Script(&'static str, usize),
    #[error("{0} must not contain NUL characters")]
    ScriptNul(&'static str),
    #[error(
        "{0} may hold at most {max} entries, each named like a shell variable (letters, digits and _, not starting \
         with a digit, at most {name} characters) with a value of at most {value} characters without NUL",
        max = input::ENV_ENTRIES.max_items,
        name = input::ENV_VAR_NAME.max_chars,
        value = input::ENV_VAR_VALUE.max_chars
    )]
    Entries(&'static str),
    #[error("{0}: the name {1:?} is Kiln's own or the shell's; choose another")]
    ReservedName(&'static str, String),
    #[error("a name cannot be both a variable and a secret: {0:?}")]
    BothVariableAndSecret(String),
    #[error(
        "lock_files must be at most {} globs of at most {} characters, relative (no leading '/', no '..') and without \
         control characters",
        input::LOCK_FILES.max_items,
        input::LOCK_GLOB.max_chars
    )]
    LockFiles,
    #[error("setup_sandbox.{0}")]
    Sandbox(String),
    #[error("mcp_servers: {0}")]
    McpServers(String),
}

/// Variables a script's environment must keep as Kiln sets them.
const RESERVED: &[&str] = &["PATH", "HOME", "USER", "PWD", "SHELL", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV"];

impl EnvironmentSpec {
    /// Checks everything serde cannot, with the rules of [`crate::input`]
    /// that the OpenAPI document states too.
    pub fn validate(&self) -> Result<(), EnvironmentError> {
        if !input::ENVIRONMENT_NAME.accepts(&self.name) {
            return Err(EnvironmentError::Name);
        }
        if self.image.as_deref().is_some_and(|i| !input::IMAGE.accepts(i)) {
            return Err(EnvironmentError::Image);
        }
        script("setup_script", &self.setup_script)?;
        if let Some(s) = &self.maintenance_script {
            script("maintenance_script", s)?;
        }
        entries("variables", &self.variables)?;
        if let Some(secrets) = &self.secrets {
            entries("secrets", secrets)?;
            if let Some(both) = secrets.keys().find(|k| self.variables.contains_key(*k)) {
                return Err(EnvironmentError::BothVariableAndSecret(both.clone()));
            }
        }
        if let Some(globs) = &self.lock_files {
            let ok = |g: &String| {
                input::LOCK_GLOB.accepts(g) && !g.starts_with('/') && !g.split('/').any(|part| part == "..")
            };
            if globs.len() > input::LOCK_FILES.max_items || !globs.iter().all(ok) {
                return Err(EnvironmentError::LockFiles);
            }
        }
        if let Some(sandbox) = &self.setup_sandbox {
            sandbox.validate().map_err(|e| EnvironmentError::Sandbox(e.to_string()))?;
        }
        crate::mcp::validate_servers(&self.mcp_servers).map_err(EnvironmentError::McpServers)?;
        Ok(())
    }

    /// The lock-file globs in force.
    pub fn lock_files(&self) -> Vec<String> {
        match &self.lock_files {
            Some(globs) => globs.clone(),
            None => DEFAULT_LOCK_FILES.iter().map(|g| (*g).to_owned()).collect(),
        }
    }
}

/// Where a repository keeps its environment, from its root.
pub const REPOSITORY_FILE: &str = ".kiln/environment.toml";
/// Largest `.kiln/environment.toml` read (two scripts at their limit fit).
pub const MAX_REPOSITORY_FILE_BYTES: u64 = 512 * 1024;

/// `.kiln/environment.toml`: an environment kept in the repository, used
/// by a run that names no environment. The same fields as the API's, in
/// TOML, except `name` (it is the repository's) and `secrets` (refused:
/// whoever reads the repository would read them); its `mcp_servers` run in
/// the sandbox only (a `url` is refused: the repository would make the
/// worker, outside the sandbox and its network policy, a client of an
/// address it chose).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentFile {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub setup_script: String,
    #[serde(default)]
    pub maintenance_script: Option<String>,
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    #[serde(default)]
    pub lock_files: Option<Vec<String>>,
    #[serde(default)]
    pub setup_sandbox: Option<SandboxSpec>,
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, RepositoryMcpServer>,
}

/// `[mcp_servers.<name>]` of `.kiln/environment.toml`: a server in the
/// sandbox, nothing else.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryMcpServer {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// Why `.kiln/environment.toml` is not acceptable. Messages are shown to
/// the run's owner (in `run.failed`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentFileError {
    #[error("{REPOSITORY_FILE} is {0} bytes; the limit is {MAX_REPOSITORY_FILE_BYTES}")]
    TooLarge(u64),
    #[error("{REPOSITORY_FILE} is not a regular file (a symbolic link or a submodule is not followed)")]
    NotAFile,
    #[error("{REPOSITORY_FILE} is not valid: {0}")]
    Parse(String),
    #[error(
        "{REPOSITORY_FILE} must not hold secrets: anyone who can read the repository could read them. Define them \
         in an environment through the API (POST /v1/environments) and name it in the run"
    )]
    Secrets,
    #[error(
        "{REPOSITORY_FILE}: the MCP server {0:?} has a url or headers; a repository may declare only servers that \
         run in the sandbox (command, args, env, cwd, timeout_s): a remote server would make the worker, outside \
         the sandbox and its network policy, a client of an address the repository chose. Define remote servers \
         in an environment through the API (POST /v1/environments) and name it in the run"
    )]
    RemoteMcpServer(String),
    #[error("{REPOSITORY_FILE}: {0}")]
    Invalid(EnvironmentError),
}

impl EnvironmentFile {
    /// Reads the file's text into the environment it defines, checked as
    /// the API checks one; `name` is what events call it.
    pub fn parse(text: &str, name: &str) -> Result<EnvironmentSpec, EnvironmentFileError> {
        if text.len() as u64 > MAX_REPOSITORY_FILE_BYTES {
            return Err(EnvironmentFileError::TooLarge(text.len() as u64));
        }
        // Secrets first, whatever else is wrong with the file.
        let table: toml::Table = toml::from_str(text).map_err(|e| parse_error(&e))?;
        if table.contains_key("secrets") {
            return Err(EnvironmentFileError::Secrets);
        }
        // Likewise a remote MCP server, before its other fields are judged.
        if let Some(toml::Value::Table(servers)) = table.get("mcp_servers") {
            for (name, server) in servers {
                if let toml::Value::Table(server) = server
                    && (server.contains_key("url") || server.contains_key("headers"))
                {
                    return Err(EnvironmentFileError::RemoteMcpServer(name.clone()));
                }
            }
        }
        let file: EnvironmentFile = toml::from_str(text).map_err(|e| parse_error(&e))?;
        let spec = EnvironmentSpec {
            name: name.to_owned(),
            image: file.image,
            setup_script: file.setup_script,
            maintenance_script: file.maintenance_script,
            variables: file.variables,
            secrets: None,
            lock_files: file.lock_files,
            setup_sandbox: file.setup_sandbox,
            mcp_servers: file
                .mcp_servers
                .into_iter()
                .map(|(name, s)| {
                    let server = McpServerSpec {
                        command: Some(s.command),
                        args: s.args,
                        env: s.env,
                        cwd: s.cwd,
                        timeout_s: s.timeout_s,
                        ..Default::default()
                    };
                    (name, server)
                })
                .collect(),
        };
        spec.validate().map_err(EnvironmentFileError::Invalid)?;
        Ok(spec)
    }
}

/// toml's message with the line and column, on one line.
fn parse_error(e: &toml::de::Error) -> EnvironmentFileError {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => EnvironmentFileError::Parse(format!("{message} (at byte {})", span.start)),
        None => EnvironmentFileError::Parse(message),
    }
}

fn script(field: &'static str, text: &str) -> Result<(), EnvironmentError> {
    if input::SCRIPT.accepts(text) {
        return Ok(());
    }
    let chars = text.chars().count();
    if chars > input::SCRIPT.max_chars {
        Err(EnvironmentError::Script(field, chars))
    } else {
        Err(EnvironmentError::ScriptNul(field))
    }
}

fn entries(field: &'static str, map: &BTreeMap<String, String>) -> Result<(), EnvironmentError> {
    let ok = map.len() <= input::ENV_ENTRIES.max_items
        && map.iter().all(|(k, v)| input::ENV_VAR_NAME.accepts(k) && input::ENV_VAR_VALUE.accepts(v));
    if !ok {
        return Err(EnvironmentError::Entries(field));
    }
    if let Some(name) = map.keys().find(|k| RESERVED.contains(&k.as_str()) || k.starts_with("KILN_")) {
        return Err(EnvironmentError::ReservedName(field, name.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<EnvironmentSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn a_minimal_environment_is_valid_and_gets_the_default_lock_files() {
        let s = spec(r#"{"name":"web"}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        assert!(s.lock_files().iter().any(|g| g == "Cargo.lock"));
    }

    #[test]
    fn a_repository_file_reads_as_the_api_body_without_name_or_secrets() {
        let text = r#"
image = "kiln-sandbox:latest"
setup_script = """
npm ci
"""
maintenance_script = "npm ci --offline"
lock_files = ["package-lock.json"]

[variables]
NODE_ENV = "development"

[setup_sandbox]
network = "bridge"
memory_mb = 512
"#;
        let spec = EnvironmentFile::parse(text, "repo").unwrap();
        assert_eq!(spec.name, "repo");
        assert_eq!(spec.setup_script, "npm ci\n");
        assert_eq!(spec.variables["NODE_ENV"], "development");
        assert_eq!(spec.lock_files(), ["package-lock.json"]);
        let sandbox = spec.setup_sandbox.unwrap();
        assert_eq!((sandbox.network, sandbox.memory_mb), (Some(crate::run::NetworkMode::Bridge), Some(512)));
        assert_eq!(EnvironmentFile::parse("", "repo").unwrap().lock_files(), DEFAULT_LOCK_FILES);
        let with_mcp = "[mcp_servers.tools]\ncommand = \"python3\"\nargs = [\"s.py\"]\ntimeout_s = 5\n";
        let spec = EnvironmentFile::parse(with_mcp, "repo").unwrap();
        let tools = &spec.mcp_servers["tools"];
        assert_eq!((tools.command.as_deref(), tools.args.as_slice()), (Some("python3"), &["s.py".to_owned()][..]));
        assert_eq!((tools.url.as_ref(), tools.timeout_s), (None, Some(5)));
    }

    #[test]
    fn a_bad_repository_file_is_refused_with_a_reason() {
        let parse = |t: &str| EnvironmentFile::parse(t, "repo").unwrap_err();
        assert_eq!(parse("setup_script = \"x\"\n[secrets]\nTOKEN = \"v\"\n"), EnvironmentFileError::Secrets);
        assert_eq!(parse("secrets = { TOKEN = \"v\" }\nunknown = 1\n"), EnvironmentFileError::Secrets);
        let unknown = parse("setup = \"make\"\n").to_string();
        assert!(unknown.contains("unknown field `setup`"), "{unknown}");
        assert!(matches!(parse("setup_script = \"unterminated\n"), EnvironmentFileError::Parse(_)));
        assert!(matches!(parse("[variables]\nPATH = \"/x\"\n"), EnvironmentFileError::Invalid(_)));
        let remote = parse("[mcp_servers.demo]\nurl = \"http://127.0.0.1:9/mcp\"\n");
        assert_eq!(remote, EnvironmentFileError::RemoteMcpServer("demo".into()));
        assert!(remote.to_string().contains("sandbox"), "{remote}");
        let headers = parse("[mcp_servers.demo]\ncommand = \"x\"\nheaders = { A = \"b\" }\n");
        assert_eq!(headers, EnvironmentFileError::RemoteMcpServer("demo".into()));
        assert!(matches!(
            parse("[mcp_servers.demo]\ncommand = \"x\"\ncwd = \"rel\"\n"),
            EnvironmentFileError::Invalid(_)
        ));
        let big = format!("setup_script = \"{}\"\n", "x".repeat(MAX_REPOSITORY_FILE_BYTES as usize));
        assert!(matches!(parse(&big), EnvironmentFileError::TooLarge(_)));
    }

    #[test]
    fn bad_input_is_refused_with_the_field_named() {
        assert!(spec(r#"{"name":"web","setup":"x"}"#).is_err(), "unknown field");
        for name in ["", "Web", "-x", "a b", &"a".repeat(65)] {
            let s = EnvironmentSpec { name: name.into(), ..Default::default() };
            assert_eq!(s.validate(), Err(EnvironmentError::Name), "{name:?}");
        }
        let big = EnvironmentSpec {
            name: "a".into(),
            setup_script: "x".repeat(input::SCRIPT.max_chars + 1),
            ..Default::default()
        };
        assert!(matches!(big.validate(), Err(EnvironmentError::Script("setup_script", _))));
        let mut vars = EnvironmentSpec { name: "a".into(), ..Default::default() };
        vars.variables.insert("1X".into(), "v".into());
        assert_eq!(vars.validate(), Err(EnvironmentError::Entries("variables")));
        vars.variables = BTreeMap::from([("PATH".into(), "/x".into())]);
        assert!(matches!(vars.validate(), Err(EnvironmentError::ReservedName("variables", _))));
        let both = spec(r#"{"name":"a","variables":{"T":"1"},"secrets":{"T":"2"}}"#).unwrap();
        assert!(matches!(both.validate(), Err(EnvironmentError::BothVariableAndSecret(_))));
        for glob in ["/etc/passwd", "../x", "a/../../b"] {
            let s = EnvironmentSpec { name: "a".into(), lock_files: Some(vec![glob.into()]), ..Default::default() };
            assert_eq!(s.validate(), Err(EnvironmentError::LockFiles), "{glob}");
        }
    }
}
