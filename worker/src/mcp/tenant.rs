//! The servers a run's environment adds to the operator's: an API
//! environment's (remote ones with their sealed headers opened, or in the
//! sandbox) or `.kiln/environment.toml`'s (in the sandbox only). They join
//! the operator's servers; a name both use is the operator's server, and
//! the model is told the environment's was shadowed.

use std::collections::BTreeMap;

use super::config::{McpConfig, ServerConfig};

/// An environment's servers, ready to connect, and those it declares but
/// the run cannot have (headers that did not open, say), with why.
#[derive(Debug, Default)]
pub struct EnvironmentServers {
    pub servers: BTreeMap<String, ServerConfig>,
    /// Server name → why it is missing (told to the model if the run wants it).
    pub unusable: BTreeMap<String, String>,
}

impl EnvironmentServers {
    /// The operator's servers with the environment's added, a line for the
    /// model for each of the environment's that `wanted` names (all when
    /// `None`) but the run does not get, and `wanted` without the unusable
    /// ones (already told).
    pub fn joined(
        self,
        operator: &McpConfig,
        wanted: Option<&[String]>,
    ) -> (McpConfig, Vec<String>, Option<Vec<String>>) {
        let wants = |name: &str| wanted.is_none_or(|w| w.iter().any(|n| n == name));
        let mut config = operator.clone();
        let mut problems = Vec::new();
        for (name, server) in self.servers {
            if config.servers.contains_key(&name) {
                if wants(&name) {
                    problems.push(format!(
                        "- {name}: the environment's MCP server of this name is shadowed by the deployment's, \
                         which is used instead"
                    ));
                }
                continue;
            }
            config.servers.insert(name, server);
        }
        let mut told = Vec::new();
        for (name, why) in self.unusable {
            // A deployment's server of that name is used: nothing is missing.
            if wants(&name) && !config.servers.contains_key(&name) {
                problems.push(format!("- {name}: {why}"));
                told.push(name);
            }
        }
        let wanted = wanted.map(|w| w.iter().filter(|n| !told.contains(n)).cloned().collect());
        (config, problems, wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::McpConfig;

    #[test]
    fn the_operators_server_shadows_the_environments_and_the_model_is_told() {
        let operator = McpConfig::parse(r#"{"servers":{"demo":{"url":"http://127.0.0.1:9/mcp"}}}"#).unwrap();
        let env = McpConfig::parse(r#"{"servers":{"demo":{"command":"x"},"extra":{"command":"y"}}}"#).unwrap();
        let tenant = EnvironmentServers {
            servers: env.servers,
            unusable: BTreeMap::from([("sealed".to_owned(), "its headers do not open".to_owned())]),
        };
        let (joined, problems, _) = tenant.joined(&operator, None);
        assert!(matches!(joined.servers["demo"].transport, crate::mcp::Transport::Remote(_)));
        assert!(joined.servers.contains_key("extra"));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("shadowed"), "{problems:?}");
        assert!(problems[1].contains("do not open"), "{problems:?}");
        let (_, narrowed, _) = EnvironmentServers::default().joined(&operator, Some(&["extra".to_owned()]));
        assert!(narrowed.is_empty());
    }
}
