//! The model `kiln up` serves itself: Kiln's local model (a tiny real LLM
//! on this CPU) when asked for or when no model is configured, or the
//! scripted demo model (a deterministic replay, not an LLM).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln_protocol::agents::AgentKinds;
use kiln_scripted_model::ScriptedModel;
use kiln_worker::ProviderKind;

use crate::local_model::{self, LocalModel};
use crate::settings::{ModelArgs, ModelSource};

/// A model server `up` started; dropping it stops it.
pub enum ServedModel {
    Scripted(ScriptedModel),
    Local(LocalModel),
}

impl ServedModel {
    /// Starts the model `up` serves, if it serves one, and points `model` at
    /// it (as an OpenAI-compatible server). A model of the user's own is
    /// left as it is. `kinds`: the sub-agent kinds the worker offers (a
    /// local model's warm-up sends the `task` tool runs are shown).
    pub async fn start(
        model: &mut ModelArgs,
        state_dir: &Path,
        kinds: Arc<AgentKinds>,
    ) -> anyhow::Result<Option<ServedModel>> {
        let served = match model.model_provider {
            ModelSource::Scripted => ServedModel::Scripted(start_scripted(model).await?),
            ModelSource::Local => {
                ServedModel::Local(start_local(model, state_dir, kinds, "KILN_MODEL_PROVIDER=local").await?)
            }
            ModelSource::Server(_) if !model.is_configured() => {
                ServedModel::Local(start_local(model, state_dir, kinds, "no model configured").await?)
            }
            ModelSource::Server(_) => return Ok(None),
        };
        Ok(Some(served))
    }

    /// Stops the server and waits for it to exit.
    pub async fn stop(self) {
        match self {
            ServedModel::Scripted(scripted) => scripted.shutdown().await,
            ServedModel::Local(local) => local.stop().await,
        }
    }
}

async fn start_scripted(model: &mut ModelArgs) -> anyhow::Result<ScriptedModel> {
    let scripted = ScriptedModel::start(kiln_scripted_model::demo_script()).await?;
    // Every run gets the whole script, however many ran before it.
    scripted.replay_per_conversation();
    model.model_provider = ModelSource::Server(ProviderKind::OpenAi);
    model.model_base_url = Some(scripted.openai_base_url());
    model.model = "kiln-demo-script".into();
    eprintln!(
        "kiln: KILN_MODEL_PROVIDER=scripted: runs use Kiln's scripted demo model, a fixed replay of the\n\
         demo's script for every run (deterministic, not a real LLM)."
    );
    Ok(scripted)
}

/// `why`: what made `up` serve it, for the message.
async fn start_local(
    model: &mut ModelArgs,
    state_dir: &Path,
    kinds: Arc<AgentKinds>,
    why: &str,
) -> anyhow::Result<LocalModel> {
    let options = local_model::Options { kinds, ..model.local_model_options(state_dir) };
    let (what, caveat) = match &options.model {
        None => (
            "SmolLM2-135M-Instruct, a tiny demo model (135M parameters)".to_owned(),
            "A model this small shows the machinery (real streamed tool calls) but does no real work.\n  ",
        ),
        Some(path) => (path.display().to_string(), ""),
    };
    local_model::ensure_installed(&options.dir).await?;
    let started = Instant::now();
    let server = LocalModel::start_installed(options).await?;
    eprintln!(
        "kiln: {why}, so Kiln serves a local model on this CPU: {what},\n\
         \x20 with llama.cpp's server at {url} (started, and the runs' common prompt read into its cache,\n\
         \x20 in {secs:.1} s; log: {log}).\n\
         \x20 {caveat}Answers are capped at {max} tokens (KILN_LOCAL_MODEL_MAX_TOKENS).\n\
         \x20 For a real model set OPENAI_API_KEY (and KILN_MODEL),\n\
         \x20 ANTHROPIC_API_KEY with KILN_MODEL_PROVIDER=anthropic, or KILN_MODEL_BASE_URL for Ollama, vLLM\n\
         \x20 or any OpenAI-compatible server.",
        url = server.base_url(),
        secs = started.elapsed().as_secs_f64(),
        log = server.log_path().display(),
        max = model.local_model_max_tokens,
    );
    model.model_provider = ModelSource::Server(ProviderKind::OpenAi);
    model.model_base_url = Some(server.openai_base_url());
    model.anthropic_base_url = Some(server.anthropic_base_url());
    // Keys are only for the providers they belong to.
    model.openai_api_key = None;
    model.anthropic_api_key = None;
    model.model = server.model_name().to_owned();
    model.model_max_tokens = model.local_model_max_tokens;
    Ok(server)
}
