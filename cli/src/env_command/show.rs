//! Environments in words: the table of `kiln env list` and the details of
//! `kiln env show`. Server text is cleaned before it is printed.

use kiln_protocol::Environment;

use crate::render::one_line;
use crate::render::printable::printable;

/// `web (image kiln-sandbox)`.
pub fn title(env: &Environment) -> String {
    format!("{} (image {})", printable(&env.name), printable(env.image.as_deref().unwrap_or("the deployment's")))
}

pub fn table(environments: &[Environment]) -> Vec<String> {
    if environments.is_empty() {
        return vec!["(no environments; `kiln env create NAME --setup '…'` makes one)".to_owned()];
    }
    let mut lines = vec![format!("{:<24}  {:<28}  {:>10}  {:<20}  SETUP", "NAME", "IMAGE", "GENERATION", "SECRETS")];
    for env in environments {
        lines.push(format!(
            "{:<24}  {:<28}  {:>10}  {:<20}  {}",
            printable(&env.name),
            one_line(&printable(env.image.as_deref().unwrap_or("(default)")), 28),
            env.cache_generation,
            one_line(&printable(&env.secret_names.join(",")), 20),
            one_line(&printable(&env.setup_script), 50),
        ));
    }
    lines
}

pub fn details(env: &Environment) -> Vec<String> {
    let mut lines =
        vec![format!("environment {}", title(env)), format!("  cache generation: {}", env.cache_generation)];
    lines.push("  setup script:".to_owned());
    lines.extend(script_lines(&env.setup_script));
    if let Some(maintenance) = &env.maintenance_script {
        lines.push("  maintenance script:".to_owned());
        lines.extend(script_lines(maintenance));
    }
    for (name, value) in &env.variables {
        lines.push(format!("  variable {}={}", printable(name), printable(value)));
    }
    let secrets = if env.secret_names.is_empty() { "(none)".to_owned() } else { env.secret_names.join(", ") };
    lines.push(format!("  secrets (values never shown): {}", printable(&secrets)));
    lines.push(format!("  lock files: {}", printable(&env.lock_files.join(", "))));
    if let Some(egress) = &env.setup_sandbox.egress {
        let hosts: Vec<String> = egress.allow.iter().flatten().map(|r| r.host.clone()).collect();
        lines.push(
            format!("  setup network: {} {}", egress.mode.as_str(), printable(&hosts.join(", "))).trim_end().to_owned(),
        );
    }
    for (name, server) in &env.mcp_servers {
        let what = server.url.clone().or_else(|| server.command.clone()).unwrap_or_default();
        lines.push(format!("  MCP server {}: {}", printable(name), printable(&what)));
    }
    lines
}

fn script_lines(script: &str) -> Vec<String> {
    printable(script).lines().map(|l| format!("    {l}")).collect()
}
