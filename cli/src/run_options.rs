//! The flags of `kiln run` that choose what a run may use — environment,
//! network, MCP servers, sub-agents, budgets — turned into the API's
//! `CreateRun` fields. Kept apart from the command's other flags so each
//! reads as one thing.

use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_protocol::{CreateRun, Limits, SandboxSpec};

/// The word `--mcp` and `--agents` take for "none at all".
const NONE: &str = "none";

#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunOptions {
    /// Prepare the sandbox with this environment of yours (`kiln env list`):
    /// its image, setup script (cached after the first run), variables and
    /// secrets. Without it, the repository's .kiln/environment.toml if it
    /// has one, else the deployment's bare image.
    #[arg(long, value_name = "NAME")]
    pub environment: Option<String>,
    /// Network for the agent's commands, through Kiln's egress proxy and
    /// within the deployment's policy: none (the default: no network),
    /// allowlist (only the hosts of --allow, or the deployment's list) or
    /// open (any public address).
    #[arg(long, value_name = "MODE", value_parser = parse_egress)]
    pub egress: Option<EgressMode>,
    /// With --egress allowlist: a host the agent may reach, HOST (ports 80
    /// and 443) or HOST:PORT; `*.example.com` allows the names under it.
    /// Repeat for more. Without it the deployment's allowlist applies.
    #[arg(long = "allow", value_name = "HOST[:PORT]", value_parser = parse_host_rule)]
    pub allow: Vec<HostRule>,
    /// An MCP server (the deployment's, or the environment's) whose tools
    /// the run gets; repeat for more, `--mcp none` for none. All of them
    /// when not given.
    #[arg(long = "mcp", value_name = "NAME")]
    pub mcp: Vec<String>,
    /// A kind of sub-agent the run's `task` tool offers (general, explore,
    /// or the deployment's); repeat for more, `--agents none` for no
    /// sub-agents. All kinds when not given.
    #[arg(long = "agents", value_name = "KIND")]
    pub agents: Vec<String>,
    /// Most model calls the run makes before it stops.
    #[arg(long, value_name = "N")]
    pub max_steps: Option<u32>,
    /// Most the run may spend on the model, in US dollars (priced with the
    /// worker's price table).
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
}

/// A flag combination the API would refuse, said in the flags' words.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct OptionsError(pub String);

impl RunOptions {
    /// Sets the fields these flags choose on `spec`.
    pub fn apply(&self, spec: &mut CreateRun) -> Result<(), OptionsError> {
        spec.environment = self.environment.clone();
        spec.mcp = names(&self.mcp, "--mcp")?;
        spec.agents = names(&self.agents, "--agents")?;
        if self.max_steps.is_some() || self.max_cost.is_some() {
            let limits = spec.limits.get_or_insert_with(Limits::default);
            limits.max_steps = self.max_steps.or(limits.max_steps);
            limits.max_cost_usd = self.max_cost.or(limits.max_cost_usd);
        }
        if let Some(egress) = self.egress_policy()? {
            spec.sandbox.get_or_insert_with(SandboxSpec::default).egress = Some(egress);
        }
        Ok(())
    }

    /// Whether any of these flags was given (they do not apply to a
    /// follow-up, which keeps its session's settings).
    pub fn any(&self) -> bool {
        self.environment.is_some()
            || self.egress.is_some()
            || !self.allow.is_empty()
            || !self.mcp.is_empty()
            || !self.agents.is_empty()
            || self.max_steps.is_some()
            || self.max_cost.is_some()
    }

    fn egress_policy(&self) -> Result<Option<EgressPolicy>, OptionsError> {
        match (self.egress, self.allow.is_empty()) {
            (None, true) => Ok(None),
            (Some(EgressMode::Allowlist), _) => Ok(Some(EgressPolicy {
                mode: EgressMode::Allowlist,
                allow: (!self.allow.is_empty()).then(|| self.allow.clone()),
            })),
            (Some(mode), true) => Ok(Some(EgressPolicy { mode, allow: None })),
            (_, false) => Err(OptionsError("--allow needs --egress allowlist".into())),
        }
    }
}

/// `--mcp a --mcp b` → `["a", "b"]`; `--mcp none` → `[]`; none given →
/// absent (all).
fn names(given: &[String], flag: &str) -> Result<Option<Vec<String>>, OptionsError> {
    match given {
        [] => Ok(None),
        [only] if only == NONE => Ok(Some(Vec::new())),
        many if many.iter().any(|n| n == NONE) => {
            Err(OptionsError(format!("{flag} none cannot be combined with names")))
        }
        many => Ok(Some(many.to_vec())),
    }
}

pub(crate) fn parse_egress(s: &str) -> Result<EgressMode, String> {
    match s {
        "none" => Ok(EgressMode::None),
        "allowlist" => Ok(EgressMode::Allowlist),
        "open" => Ok(EgressMode::Open),
        _ => Err(format!("{s:?}: expected none, allowlist or open")),
    }
}

/// `HOST` or `HOST:PORT` (the API checks the host's form).
pub(crate) fn parse_host_rule(s: &str) -> Result<HostRule, String> {
    let (host, ports) = match s.rsplit_once(':') {
        Some((host, port)) => {
            let port: u16 = port.parse().map_err(|_| format!("{s:?}: the port must be a number from 1 to 65535"))?;
            if port == 0 {
                return Err(format!("{s:?}: the port must be a number from 1 to 65535"));
            }
            (host, vec![port])
        }
        None => (s, Vec::new()),
    };
    if host.is_empty() {
        return Err(format!("{s:?}: a host name is needed, e.g. registry.npmjs.org or *.example.com:8443"));
    }
    Ok(HostRule { host: host.to_owned(), ports, methods: None, path_prefixes: None })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_the_runs_fields() {
        let options = RunOptions {
            environment: Some("web".into()),
            egress: Some(EgressMode::Allowlist),
            allow: vec![parse_host_rule("registry.npmjs.org").unwrap(), parse_host_rule("*.x.org:8443").unwrap()],
            mcp: vec!["none".into()],
            agents: vec!["explore".into()],
            max_steps: Some(7),
            max_cost: Some(0.5),
        };
        let mut spec = CreateRun::default();
        options.apply(&mut spec).unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["environment"], "web");
        assert_eq!(json["mcp"], serde_json::json!([]));
        assert_eq!(json["agents"], serde_json::json!(["explore"]));
        assert_eq!(json["limits"], serde_json::json!({"max_steps": 7, "max_cost_usd": 0.5}));
        assert_eq!(
            json["sandbox"]["egress"],
            serde_json::json!({"mode": "allowlist", "allow": [{"host": "registry.npmjs.org"}, {"host": "*.x.org", "ports": [8443]}]})
        );
    }

    #[test]
    fn contradictions_are_refused_in_the_flags_words() {
        let allow_without_allowlist = RunOptions {
            egress: Some(EgressMode::Open),
            allow: vec![parse_host_rule("a.org").unwrap()],
            ..Default::default()
        };
        assert!(allow_without_allowlist.apply(&mut CreateRun::default()).is_err());
        let mixed = RunOptions { mcp: vec!["none".into(), "github".into()], ..Default::default() };
        assert!(mixed.apply(&mut CreateRun::default()).is_err());
        assert!(parse_host_rule("a.org:0").is_err() && parse_host_rule(":80").is_err());
        assert!(parse_egress("bridge").is_err());
    }
}
