//! Talking to a run: `kiln say RUN TEXT` steers a working run or starts a
//! follow-up of a finished one (`POST /v1/runs/{id}/messages`); `kiln run
//! --session RUN` is the same follow-up, followed like a new run.

use std::process::ExitCode;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::KilnClient;
use crate::render::Mode;
use crate::render::printable::{escape_raw_controls, printable};

/// Where a message went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// Joined the active run `run`'s conversation.
    Queued { run: Uuid },
    /// Started the follow-up run `run` in the finished run's session.
    FollowUp { run: Uuid },
}

impl Delivered {
    pub fn run(&self) -> Uuid {
        match self {
            Delivered::Queued { run } | Delivered::FollowUp { run } => *run,
        }
    }
}

/// Sends `text` to run `id`; the API's answer and where it went.
pub async fn send(client: &KilnClient, id: Uuid, text: &str) -> anyhow::Result<(Value, Delivered)> {
    let id_text = id.to_string();
    let answer = client.call(Method::POST, &["runs", &id_text, "messages"], Some(&json!({ "text": text }))).await?;
    let run = answer["run"]["id"].as_str().and_then(|s| Uuid::try_parse(s).ok());
    let Some(run) = run else { anyhow::bail!("unexpected answer from Kiln: {answer}") };
    let delivered = match answer["disposition"].as_str() {
        Some("follow_up") => Delivered::FollowUp { run },
        _ => Delivered::Queued { run },
    };
    Ok((answer, delivered))
}

/// `kiln say`.
pub async fn say(client: &KilnClient, id: Uuid, text: &str, follow: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (answer, delivered) = send(client, id, text).await?;
    let kiln = crate::invocation::kiln();
    if json && !follow {
        println!("{}", escape_raw_controls(&serde_json::to_string(&answer)?));
        return Ok(ExitCode::SUCCESS);
    }
    let said = match &delivered {
        Delivered::Queued { run } => {
            format!("message queued for run {run}: it joins the conversation before the run's next model call")
        }
        Delivered::FollowUp { run } => format!(
            "run {id} had finished: follow-up run {run} started in its session ({})",
            printable(answer["run"]["status"].as_str().unwrap_or("queued"))
        ),
    };
    // Under --json stdout carries only the events.
    if json {
        eprintln!("{said}")
    } else {
        println!("{said}")
    }
    if !follow {
        println!("follow it: {kiln} logs --follow {}", delivered.run());
        return Ok(ExitCode::SUCCESS);
    }
    crate::commands::watch(client, delivered.run(), true, Mode::choose(json)).await
}

/// `kiln run --session RUN --prompt …`: the prompt as a follow-up of the
/// finished run `session_of` (its conversation and workspace kept).
pub async fn follow_up(
    client: &KilnClient,
    session_of: Uuid,
    prompt: &str,
    follow: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (answer, delivered) = send(client, session_of, prompt).await?;
    if let Delivered::Queued { run } = delivered {
        // The session's run is still working: the prompt steers it instead.
        eprintln!("kiln: run {run} is still working; the prompt joins its conversation (as `kiln say` would)");
    }
    let run = delivered.run();
    if json && !follow {
        println!("{}", escape_raw_controls(&serde_json::to_string(&answer["run"])?));
        return Ok(ExitCode::SUCCESS);
    }
    let header = format!(
        "run {run} {} (session of run {session_of})",
        printable(answer["run"]["status"].as_str().unwrap_or(""))
    );
    if json {
        eprintln!("{header}")
    } else {
        println!("{header}")
    }
    if !follow {
        let kiln = crate::invocation::kiln();
        println!("follow it: {kiln} logs --follow {run}   (cancel: {kiln} cancel {run})");
        return Ok(ExitCode::SUCCESS);
    }
    crate::commands::watch(client, run, true, Mode::choose(json)).await
}
