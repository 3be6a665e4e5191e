//! An environment's definition from `kiln env create|update`'s flags, a
//! TOML file and a secrets file.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_protocol::environment::EnvironmentFile;
use kiln_protocol::mcp::{McpServerSpec, McpServerView};
use kiln_protocol::{Environment, EnvironmentSpec, SandboxSpec};

use crate::run_options::{parse_egress, parse_host_rule};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct DefinitionArgs {
    /// A TOML file with the environment's fields, as a repository's
    /// .kiln/environment.toml has them (image, setup_script,
    /// maintenance_script, variables, lock_files, setup_sandbox,
    /// mcp_servers; no secrets). The flags below change what it says.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The image setup starts from (one the deployment allows); the
    /// deployment's sandbox image when absent.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// The setup script, run once by bash in /workspace; its result is cached.
    #[arg(long, value_name = "SCRIPT")]
    pub setup: Option<String>,
    /// The maintenance script, run on every reuse of a prepared sandbox.
    #[arg(long, value_name = "SCRIPT")]
    pub maintenance: Option<String>,
    /// A plain variable for both scripts and the agent's commands, NAME=VALUE;
    /// repeat for more (on update, added to or replacing the stored ones).
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_pair)]
    pub vars: Vec<(String, String)>,
    /// A glob of the files whose contents key the cache (e.g.
    /// package-lock.json); repeat for more. Replaces the list.
    #[arg(long = "lock-file", value_name = "GLOB")]
    pub lock_files: Vec<String>,
    /// Read the setup script's secrets from this file, `-` for stdin: one
    /// NAME=VALUE a line (blank lines and lines starting with # are skipped;
    /// the value is taken as it is, up to the line's end). Never given on
    /// the command line. On update, they replace the stored secrets.
    #[arg(long = "secrets", value_name = "PATH|-")]
    pub secrets: Option<PathBuf>,
    /// Network for the setup script: none, allowlist (the hosts of
    /// --setup-allow) or open; within the deployment's egress policy.
    #[arg(long, value_name = "MODE", value_parser = parse_egress)]
    pub setup_egress: Option<EgressMode>,
    /// With --setup-egress allowlist: a host setup may reach, HOST or
    /// HOST:PORT; repeat for more.
    #[arg(long = "setup-allow", value_name = "HOST[:PORT]", value_parser = parse_host_rule)]
    pub setup_allow: Vec<HostRule>,
}

impl DefinitionArgs {
    /// The definition to send for `name`: from the file, else from
    /// `current` (on update), else empty; then the flags.
    pub fn spec(&self, name: &str, current: Option<&Environment>) -> anyhow::Result<EnvironmentSpec> {
        let mut spec = match (&self.file, current) {
            (Some(path), _) => from_file(path, name)?,
            (None, Some(current)) => from_current(current),
            (None, None) => EnvironmentSpec { name: name.to_owned(), ..Default::default() },
        };
        spec.name = name.to_owned();
        if let Some(image) = &self.image {
            spec.image = Some(image.clone());
        }
        if let Some(setup) = &self.setup {
            spec.setup_script = setup.clone();
        }
        if let Some(maintenance) = &self.maintenance {
            spec.maintenance_script = Some(maintenance.clone());
        }
        spec.variables.extend(self.vars.iter().cloned());
        if !self.lock_files.is_empty() {
            spec.lock_files = Some(self.lock_files.clone());
        }
        self.setup_network(&mut spec)?;
        if let Some(path) = &self.secrets {
            spec.secrets = Some(parse_secrets(&read_secrets(path)?)?);
        }
        Ok(spec)
    }

    fn setup_network(&self, spec: &mut EnvironmentSpec) -> anyhow::Result<()> {
        let policy = match (self.setup_egress, self.setup_allow.is_empty()) {
            (None, true) => return Ok(()),
            (Some(EgressMode::Allowlist), _) => EgressPolicy {
                mode: EgressMode::Allowlist,
                allow: (!self.setup_allow.is_empty()).then(|| self.setup_allow.clone()),
            },
            (Some(mode), true) => EgressPolicy { mode, allow: None },
            (_, false) => bail!("--setup-allow needs --setup-egress allowlist"),
        };
        spec.setup_sandbox.get_or_insert_with(SandboxSpec::default).egress = Some(policy);
        Ok(())
    }
}

fn from_file(path: &Path, name: &str) -> anyhow::Result<EnvironmentSpec> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    EnvironmentFile::parse(&text, name).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// What the environment is now, as a definition to change: secrets and MCP
/// headers are not sent, so the API keeps the stored ones.
fn from_current(env: &Environment) -> EnvironmentSpec {
    EnvironmentSpec {
        name: env.name.clone(),
        image: env.image.clone(),
        setup_script: env.setup_script.clone(),
        maintenance_script: env.maintenance_script.clone(),
        variables: env.variables.clone(),
        secrets: None,
        lock_files: Some(env.lock_files.clone()),
        setup_sandbox: (env.setup_sandbox != SandboxSpec::default()).then(|| env.setup_sandbox.clone()),
        mcp_servers: env.mcp_servers.iter().map(|(name, view)| (name.clone(), server_spec(view))).collect(),
    }
}

fn server_spec(view: &McpServerView) -> McpServerSpec {
    McpServerSpec {
        url: view.url.clone(),
        headers: None,
        command: view.command.clone(),
        args: view.args.clone(),
        env: view.env.clone(),
        cwd: view.cwd.clone(),
        timeout_s: Some(view.timeout_s),
    }
}

fn read_secrets(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading the secrets from stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading the secrets from {}", path.display()))
}

/// `NAME=VALUE` lines. Errors name the line, never a value.
fn parse_secrets(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut secrets = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            bail!("secrets line {}: expected NAME=VALUE", number + 1);
        };
        secrets.insert(name.trim().to_owned(), value.to_owned());
    }
    Ok(secrets)
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{s:?}: expected NAME=VALUE")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_lines_of_name_and_value_and_errors_never_quote_them() {
        let parsed = parse_secrets("# npm\nNPM_TOKEN=abc=def\r\n\nOTHER= spaced \n").unwrap();
        assert_eq!(parsed["NPM_TOKEN"], "abc=def");
        assert_eq!(parsed["OTHER"], " spaced ");
        let err = parse_secrets("A=1\nhunter2\n").unwrap_err().to_string();
        assert_eq!(err, "secrets line 2: expected NAME=VALUE");
    }

    #[test]
    fn flags_change_the_file_and_an_update_keeps_what_they_do_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("environment.toml");
        std::fs::write(&file, "setup_script = \"npm ci\"\n[variables]\nA = \"1\"\n").unwrap();
        let args = DefinitionArgs {
            file: Some(file),
            vars: vec![("B".into(), "2".into())],
            setup_egress: Some(EgressMode::Open),
            ..Default::default()
        };
        let spec = args.spec("web", None).unwrap();
        assert_eq!((spec.name.as_str(), spec.setup_script.as_str()), ("web", "npm ci"));
        assert_eq!(spec.variables.len(), 2);
        assert_eq!(spec.setup_sandbox.unwrap().egress.unwrap().mode, EgressMode::Open);
        assert!(spec.secrets.is_none(), "no --secrets: the stored ones stay");
    }
}
