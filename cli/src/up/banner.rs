//! What `kiln up` says once it serves: where the API and the web view are,
//! and the line to paste (`export KILN_URL=… KILN_TOKEN=…`), printed last
//! so it stays on screen; `kiln up --print-env` prints that line again.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use secrecy::{ExposeSecret, SecretString};

use super::down;
use crate::local;

/// The running `kiln up`'s API base URL, in its state directory (removed
/// when it stops): how `--print-env` finds the address it listens on.
pub const URL_FILE: &str = "up.url";
/// How long the tokens `kiln up` prints are valid.
const TOKEN_TTL: Duration = Duration::from_secs(7 * 86_400);

/// A token for subject `local`, signed with the API's secret.
pub fn token(secret: &SecretString) -> anyhow::Result<String> {
    Ok(kiln_api::auth::mint_hs256(secret.expose_secret().as_bytes(), "local", TOKEN_TTL)?)
}

pub fn remember_url(state_dir: &Path, base: &str) -> anyhow::Result<()> {
    let path = state_dir.join(URL_FILE);
    std::fs::write(&path, base).with_context(|| format!("writing {}", path.display()))
}

pub fn export_line(base: &str, token: &str) -> String {
    format!("export KILN_URL={base} KILN_TOKEN={token}")
}

/// The banner: the last lines `kiln up` prints unless something goes wrong.
pub fn print(base: &str, token: &str, state_dir: &Path) {
    let kiln = crate::invocation::kiln();
    eprintln!(
        "kiln: state in {}; Ctrl-C stops Kiln and everything it started; `{kiln} down --reset` deletes the local data\n\
         kiln: server log: warnings only (RUST_LOG=info for more, every HTTP request included)\n\
         kiln: API at {base}; the web view is at {base}/ (sign in with the token below)\n\
         kiln: token for subject \"local\" (7 days; `{kiln} up --print-env` prints this line again):\n  {}",
        state_dir.display(),
        export_line(base, token)
    );
}

/// `kiln up --print-env`: the export line of the `kiln up` running for
/// `state_dir`, on stdout.
pub fn print_env(state_dir: &Path, secret: Option<&SecretString>) -> anyhow::Result<ExitCode> {
    let kiln = crate::invocation::kiln();
    let running = std::fs::read_to_string(state_dir.join(down::PID_FILE))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .is_some_and(down::is_kiln);
    let base = std::fs::read_to_string(state_dir.join(URL_FILE)).ok().map(|b| b.trim().to_owned());
    let Some(base) = base.filter(|_| running) else {
        bail!("no kiln up is serving for {}; start one with `{kiln} up`", state_dir.display());
    };
    let secret = match secret {
        Some(secret) => secret.clone(),
        None => local::read_local_secret(state_dir)?,
    };
    println!("{}", export_line(&base, &token(&secret)?));
    Ok(ExitCode::SUCCESS)
}
