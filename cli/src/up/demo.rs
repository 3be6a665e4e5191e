//! `kiln up --demo`: submit a run on a demo repository, follow it, and tell
//! how it ended.

use std::path::Path;
use std::process::ExitCode;

use kiln_protocol::{CreateRun, Limits, RepoSpec, RunStatus};

use crate::client::KilnClient;
use crate::commands;
use crate::local;
use crate::render::Mode;

/// Runs the demo against the API at `base`; `tiny_model`: the model is
/// Kiln's local one, so the task is one it can do.
pub async fn run(base: &str, token: &str, state_dir: &Path, tiny_model: bool) -> anyhow::Result<ExitCode> {
    let repo = local::ensure_demo_repo(state_dir).await?;
    let client = KilnClient::new(base, token)?;
    let repo = Some(RepoSpec { url: format!("file://{}", repo.display()), git_ref: None });
    let spec = if tiny_model {
        // A task the tiny model can do: one tool call, then one answer.
        CreateRun {
            prompt: "Run `cat README.md` with bash, then reply with one sentence.".into(),
            repo,
            limits: Some(Limits { max_steps: Some(4), timeout_s: Some(600), ..Default::default() }),
            ..Default::default()
        }
    } else {
        CreateRun {
            prompt: "Look around the repository, add a NOTES.md that describes it, and check the result.".into(),
            repo,
            ..Default::default()
        }
    };
    let run = client.create_run(&spec).await?;
    eprintln!("kiln: demo run {} submitted; following its events\n", run.id);
    let code = commands::watch(&client, run.id, true, Mode::choose(false)).await?;
    let finished = client.get_run(run.id).await?;
    if finished.status == RunStatus::Succeeded {
        println!("\nkiln: the demo run succeeded ({}).", run.id);
    } else {
        println!("\nkiln: the demo run ended {}: {}", finished.status, finished.error.unwrap_or_default());
    }
    Ok(code)
}
