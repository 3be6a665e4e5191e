//! The CLI's side of best-of-N attempts: `kiln select RUN K`, and which run
//! `kiln diff`/`kiln apply` read for `--attempt K`.

use std::process::ExitCode;

use anyhow::bail;
use uuid::Uuid;

use crate::client::KilnClient;

/// The run whose change `--attempt K` of `group` means: the group's K-th
/// attempt; with no `--attempt`, `group` itself.
pub async fn resolve(client: &KilnClient, group: Uuid, attempt: Option<u32>) -> anyhow::Result<Uuid> {
    let Some(k) = attempt else { return Ok(group) };
    let run = client.get_run(group).await?;
    let Some(attempts) = run.attempts else {
        bail!("run {group} is not a group of attempts (it was not submitted with --attempts)");
    };
    match usize::try_from(k).ok().and_then(|k| k.checked_sub(1)).and_then(|i| attempts.get(i)) {
        Some(id) => Ok(*id),
        None => {
            bail!("run {group} has {} attempts; --attempt must be between 1 and {}", attempts.len(), attempts.len())
        }
    }
}

/// `kiln select RUN K`.
pub async fn select(client: &KilnClient, group: Uuid, attempt: u32) -> anyhow::Result<ExitCode> {
    let run = client.select_attempt(group, attempt).await?;
    let chosen = run.attempts.as_ref().and_then(|a| a.get(attempt.saturating_sub(1) as usize));
    match chosen {
        Some(id) => println!("attempt {attempt} (run {id}) is the result of run {group}"),
        None => println!("attempt {attempt} is the result of run {group}"),
    }
    println!("  kiln diff {group}    kiln apply {group}");
    Ok(ExitCode::SUCCESS)
}

/// After following group `group`: each attempt's diffstat and how to
/// choose one. A failure to read them is said, not fatal.
pub async fn choose_hint(client: &KilnClient, group: Uuid) {
    let kiln = crate::invocation::kiln();
    let attempts = match client.get_run(group).await {
        Ok(run) => run.attempts.unwrap_or_default(),
        Err(e) => return eprintln!("kiln: the group could not be read: {e:#}"),
    };
    for (k, id) in attempts.iter().enumerate() {
        let line = match client.get_run(*id).await {
            Ok(run) => match run.changes {
                Some(c) => format!("{}: {} files +{} -{}", run.status, c.files, c.additions, c.deletions),
                None => format!("{}: no change captured", run.status),
            },
            Err(e) => format!("could not be read: {e:#}"),
        };
        println!("attempt {}: {line}   ({kiln} diff {group} --attempt {})", k + 1, k + 1);
    }
    println!("choose one: {kiln} select {group} K   (then {kiln} apply {group})");
}
