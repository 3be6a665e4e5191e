//! The client commands of `kiln`: `run`, `runs`, `logs`, `cancel`,
//! `approve`, `diff`, `apply`, against a running Kiln at `KILN_URL` with
//! `KILN_TOKEN`.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use kiln_protocol::changes::ChangeScope;
use kiln_protocol::{CreateRun, Run};
use secrecy::{ExposeSecret, SecretString};
use uuid::Uuid;

use crate::client::{Cancelled, Decision, KilnClient, StreamedEvent};
use crate::render::diffstat::{coloured_patch, diffstat};
use crate::render::printable::{escape_raw_controls, printable, printable_event};
use crate::render::{Mode, Outcome, Totals, one_line};

/// Where Kiln is and who we are to it.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The Kiln API's base URL (without `/v1`).
    #[arg(long, env = "KILN_URL", default_value = crate::base_url::DEFAULT)]
    pub url: String,
    /// Bearer token (`kiln up` prints one; `kiln token --sub NAME` mints one).
    #[arg(long, env = "KILN_TOKEN", hide_env_values = true)]
    pub token: Option<SecretString>,
}

/// What a client command says when it has no token: where one comes from.
pub fn no_token() -> String {
    let kiln = crate::invocation::kiln();
    format!(
        "no token: set KILN_TOKEN (or pass --token).\n\
         `{kiln} up` prints a line to paste: export KILN_URL=… KILN_TOKEN=…\n\
         or mint one with `{kiln} token --sub NAME` (it signs with KILN_JWT_SECRET, \
         or with `kiln up`'s secret in .kiln/jwt-secret when that is not set)"
    )
}

/// A command given without something it needs, or with a setting that
/// cannot work: exits 2 like clap's own usage errors, so scripts can tell it
/// from a failed run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl Connection {
    pub fn client(&self) -> anyhow::Result<KilnClient> {
        let token = self.token.as_ref().ok_or_else(|| UsageError(no_token()))?;
        KilnClient::new(&self.url, token.expose_secret()).map_err(|e| {
            match e.downcast::<crate::base_url::BaseUrlError>() {
                Ok(bad_url) => UsageError(bad_url.to_string()).into(),
                Err(other) => other,
            }
        })
    }
}

/// The exit code after Ctrl-C, as shells report a SIGINT death (128 + 2).
const INTERRUPTED: u8 = 130;

/// Runs listed at once by `kiln runs` whose events are read for their cost.
const COST_READS_AT_ONCE: usize = 4;

/// Submits `spec`; with `follow`, shows its events to the end and exits
/// with its outcome.
/// `kiln run`: the exit code, and the run's id.
pub async fn run(client: &KilnClient, spec: &CreateRun, follow: bool, json: bool) -> anyhow::Result<(ExitCode, Uuid)> {
    let run = client.create_run(spec).await?;
    let header = format!("run {} {}: {}", run.id, run.status, one_line(&printable(&run.prompt), 50));
    if json && !follow {
        println!("{}", escape_raw_controls(&serde_json::to_string(&run)?));
    } else if json {
        // stdout carries only the events under --json.
        eprintln!("{header}");
    } else {
        println!("{header}");
    }
    if spec.repo.is_none() {
        // Said, not guessed at: an agent asked about "the code" and given
        // an empty /workspace otherwise fails in ways that look unrelated.
        eprintln!("no --repo: the run starts in an empty workspace (--repo DIR or --repo URL gives it a repository)");
    }
    if !follow {
        if !json {
            let kiln = crate::invocation::kiln();
            println!("follow it: {kiln} logs --follow {}   (cancel: {kiln} cancel {})", run.id, run.id);
        }
        return Ok((ExitCode::SUCCESS, run.id));
    }
    Ok((watch(client, run.id, true, Mode::choose(json)).await?, run.id))
}

/// Shows run `id`'s events from the start: those there are now, or with
/// `follow` all of them as they come until the run ends. The exit code is
/// the run's outcome: 0 if it succeeded, 1 if it failed, was cancelled or
/// timed out (and 0 for a run still going when not following).
pub async fn watch(client: &KilnClient, id: Uuid, follow: bool, mode: Mode) -> anyhow::Result<ExitCode> {
    let mut render = mode.renderer(id);
    let mut totals = Totals::default();
    let interrupted = {
        let on_event = |event: &StreamedEvent| {
            // Server text enters the displays for a person here, and only
            // cleaned; --json escapes what it prints itself.
            let event = if mode == Mode::Json { Cow::Borrowed(event) } else { Cow::Owned(printable_event(event)) };
            totals.observe(&event);
            render.event(&event);
        };
        let read = async {
            if follow { client.follow(id, 0, on_event).await.map(drop) } else { client.events(id, 0, on_event).await }
        };
        tokio::select! {
            read = read => {
                read?;
                false
            }
            _ = tokio::signal::ctrl_c() => true,
        }
    };
    if interrupted {
        // Ctrl-C stops the watching, not the run: clear the spinner and say
        // how to carry on.
        drop(render);
        let kiln = crate::invocation::kiln();
        eprintln!("\nkiln: stopped following; run {id} goes on: {kiln} logs {id} --follow (or {kiln} cancel {id})");
        return Ok(ExitCode::from(INTERRUPTED));
    }
    if totals.outcome.is_some() && mode != Mode::Json {
        totals.wall = wall_time(&client.get_run(id).await?);
    }
    render.finish(&totals);
    if mode != Mode::Json && totals.changes.is_some_and(|c| c.files > 0) {
        changed_files(client, id, mode == Mode::Live).await;
    }
    Ok(exit_code(totals.outcome.as_ref()))
}

/// After a run that changed files: its diffstat and the commands that get
/// the change. A failure to read it is said, not fatal: the run is over.
async fn changed_files(client: &KilnClient, id: Uuid, colour: bool) {
    let kiln = crate::invocation::kiln();
    match client.changes(id, ChangeScope::Run).await {
        Ok(changes) => {
            for line in diffstat(&changes, colour) {
                println!("{line}");
            }
            if changes.too_large {
                println!("the patch was too large to keep; the list above is what the run changed");
            } else {
                println!("apply it: {kiln} apply {id}   (see it: {kiln} diff {id})");
            }
        }
        Err(e) => eprintln!("kiln: the run's change could not be read: {}", printable(&format!("{e:#}"))),
    }
}

/// What `kiln diff` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffView {
    /// The patch: coloured on a terminal, its exact bytes otherwise.
    Patch,
    Stat,
    Json,
}

/// `kiln diff`.
pub async fn diff(client: &KilnClient, id: Uuid, view: DiffView, scope: ChangeScope) -> anyhow::Result<ExitCode> {
    let terminal = std::io::stdout().is_terminal();
    match view {
        DiffView::Json => {
            let changes = client.changes(id, scope).await?;
            println!("{}", escape_raw_controls(&serde_json::to_string(&changes)?));
        }
        DiffView::Stat => {
            let changes = client.changes(id, scope).await?;
            for line in diffstat(&changes, terminal) {
                println!("{line}");
            }
        }
        DiffView::Patch => {
            let patch = client.patch(id, scope).await?;
            let mut out = std::io::stdout().lock();
            if terminal {
                out.write_all(coloured_patch(&patch).as_bytes())?;
            } else {
                // Piped: exactly what `git apply` takes.
                out.write_all(&patch)?;
            }
            out.flush()?;
            if patch.is_empty() && terminal {
                eprintln!("run {id} changed no files");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `kiln apply`.
pub async fn apply(client: &KilnClient, id: Uuid, dir: &Path, scope: ChangeScope) -> anyhow::Result<ExitCode> {
    let run = client.get_run(id).await?;
    let changes = client.changes(id, scope).await?;
    if changes.too_large {
        let kiln = crate::invocation::kiln();
        anyhow::bail!(
            "run {id}'s change was larger than this Kiln keeps as a patch; `{kiln} diff --stat {id}` lists its files"
        );
    }
    let patch = if changes.files.is_empty() { Vec::new() } else { client.patch(id, scope).await? };
    match crate::apply::apply(&run, &changes, &patch, dir)? {
        crate::apply::Applied::Nothing => println!("run {id} changed no files: nothing to apply"),
        crate::apply::Applied::Into { top, staged } => {
            let what = crate::render::diffstat::summary(&changes.totals);
            let staged = if staged { " (staged: git diff --cached shows it)" } else { "" };
            println!("applied run {id}'s change to {}: {what}{staged}", printable(&top.display().to_string()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn exit_code(outcome: Option<&Outcome>) -> ExitCode {
    match outcome {
        Some(Outcome::Succeeded) | None => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
    }
}

/// From submission to the end: what the person waited.
fn wall_time(run: &Run) -> Option<Duration> {
    let end = run.finished_at?;
    (end - run.created_at).to_std().ok()
}

/// `kiln runs`: the newest runs, one line each (id, status, age, cost,
/// prompt), or with `json` the API's run objects, one per line.
pub async fn runs(
    client: &KilnClient,
    status: Option<kiln_protocol::RunStatus>,
    limit: u32,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let runs = client.list_runs(status, limit).await?;
    if json {
        for run in &runs {
            println!("{}", escape_raw_controls(&serde_json::to_string(run)?));
        }
        return Ok(ExitCode::SUCCESS);
    }
    // The API keeps no running total: a run's cost is the sum of its
    // model calls' costs, read from its events (a few runs at a time).
    let costs: Vec<String> = futures::stream::iter(&runs)
        .map(|run| async move {
            let mut totals = Totals::default();
            match client.events(run.id, 0, |e| totals.observe(e)).await {
                Ok(()) => totals.cost(),
                Err(_) => "?".to_owned(),
            }
        })
        .buffered(COST_READS_AT_ONCE)
        .collect()
        .await;
    println!("{}", runs_header());
    for (run, cost) in runs.iter().zip(costs) {
        println!("{}", runs_row(run, &cost, Utc::now()));
    }
    if runs.is_empty() {
        println!("(no runs)");
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_header() -> String {
    format!("{:<36}  {:<17}  {:>5}  {:>9}  PROMPT", "ID", "STATUS", "AGE", "COST")
}

fn runs_row(run: &Run, cost: &str, now: chrono::DateTime<Utc>) -> String {
    let age = age((now - run.created_at).num_seconds());
    format!(
        "{:<36}  {:<17}  {age:>5}  {cost:>9}  {}",
        run.id,
        run.status.to_string(),
        one_line(&printable(&run.prompt), 60)
    )
}

/// `42s`, `5m`, `3h`, `2d`.
fn age(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// `kiln cancel`.
pub async fn cancel(client: &KilnClient, id: Uuid) -> anyhow::Result<ExitCode> {
    match client.cancel_run(id).await? {
        (Cancelled::Now, _) => println!("run {id} cancelled"),
        (Cancelled::Requested, _) => println!("run {id}: cancellation requested; its worker is stopping it"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `kiln approve`.
pub async fn approve(
    client: &KilnClient,
    id: Uuid,
    call_id: &str,
    decision: Decision,
    reason: Option<&str>,
) -> anyhow::Result<ExitCode> {
    client.decide(id, call_id, decision, reason).await?;
    let word = match decision {
        Decision::Approve => "approved",
        Decision::Deny => "denied",
    };
    println!("call {call_id} of run {id} {word}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(-3), "0s");
        assert_eq!(age(59), "59s");
        assert_eq!(age(61), "1m");
        assert_eq!(age(7200), "2h");
        assert_eq!(age(200_000), "2d");
    }

    #[test]
    fn run_rows_line_up_under_the_header() {
        let run: Run = serde_json::from_value(serde_json::json!({
            "id": "0199a000-0000-7000-8000-000000000001", "session_id": "0199a000-0000-7000-8000-000000000002",
            "status": "awaiting_approval", "prompt": "fix\nthe bug", "model": {"provider": "openai", "name": "m"},
            "limits": {}, "approval": "mutating", "trigger": "api", "attempt": 1, "cancel_requested": false,
            "created_at": "2026-01-01T00:00:00Z", "last_event_seq": 4
        }))
        .unwrap();
        let now = "2026-01-01T00:05:00Z".parse().unwrap();
        let row = runs_row(&run, "$0.0012", now);
        assert_eq!(row, "0199a000-0000-7000-8000-000000000001  awaiting_approval     5m    $0.0012  fix the bug");
        assert_eq!(runs_header().find("STATUS"), row.find("awaiting_approval"));
        assert_eq!(runs_header().find("PROMPT"), row.find("fix the bug"));
    }
}
