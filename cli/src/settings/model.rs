//! The model: which wire format (or which model `kiln up` serves itself),
//! where, with which keys, and its limits.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use clap::builder::PossibleValue;
use kiln_worker::{ProviderEndpoints, ProviderKind};
use secrecy::SecretString;

/// What `KILN_MODEL_PROVIDER` names: the wire format of a model server, or
/// a model `kiln up` starts and serves itself (which the worker then reaches
/// as an OpenAI-compatible server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelSource {
    /// A model server spoken to in this wire format.
    Server(ProviderKind),
    /// Kiln's local model, a tiny real LLM on this CPU (`kiln up` only).
    Local,
    /// The scripted demo model, a fixed replay, not an LLM (`kiln up` only).
    Scripted,
}

impl ModelSource {
    const ALL: [ModelSource; 5] = [
        ModelSource::Server(ProviderKind::OpenAi),
        ModelSource::Server(ProviderKind::OpenAiResponses),
        ModelSource::Server(ProviderKind::Anthropic),
        ModelSource::Local,
        ModelSource::Scripted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ModelSource::Server(kind) => kind.name(),
            ModelSource::Local => "local",
            ModelSource::Scripted => "scripted",
        }
    }

    fn help(self) -> &'static str {
        match self {
            ModelSource::Server(ProviderKind::OpenAi) => "OpenAI Chat Completions; also vLLM, Ollama, llama.cpp",
            ModelSource::Server(ProviderKind::OpenAiResponses) => "the OpenAI Responses API",
            ModelSource::Server(ProviderKind::Anthropic) => "the Anthropic Messages API",
            ModelSource::Local => "`kiln up` serves Kiln's local model on this CPU",
            ModelSource::Scripted => "`kiln up` serves the scripted demo model (a fixed replay)",
        }
    }
}

impl clap::ValueEnum for ModelSource {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(self.help()))
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// The model server's wire format, or (under `kiln up`) a model Kiln serves itself.
    #[arg(long, env = "KILN_MODEL_PROVIDER", default_value = "openai")]
    pub model_provider: ModelSource,
    /// Base URL of the provider's API (OpenAI style: up to `/v1`).
    #[arg(long, env = "KILN_MODEL_BASE_URL")]
    pub model_base_url: Option<String>,
    /// Model name sent to the provider.
    #[arg(long, env = "KILN_MODEL", default_value = "gpt-4o-mini")]
    pub model: String,
    /// Seconds to wait for the next bytes of a model response before the
    /// attempt fails and is retried.
    #[arg(long, env = "KILN_MODEL_READ_TIMEOUT_S", default_value_t = 300)]
    pub model_read_timeout_s: u64,
    /// Output token limit per model call.
    #[arg(long, env = "KILN_MODEL_MAX_TOKENS", default_value_t = 4096)]
    pub model_max_tokens: u32,
    /// The model's context window in tokens (a run's `model.context_window` overrides it).
    #[arg(long, env = "KILN_MODEL_CONTEXT_TOKENS", default_value_t = 128_000)]
    pub model_context_tokens: u32,
    /// Share of the context window a step's input may reach before older messages are summarised.
    #[arg(long, env = "KILN_COMPACTION_THRESHOLD", default_value_t = 0.8)]
    pub compaction_threshold: f64,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub openai_api_key: Option<SecretString>,
    #[arg(long, env = "ANTHROPIC_API_KEY", hide_env_values = true)]
    pub anthropic_api_key: Option<SecretString>,
    /// Anthropic's base URL, when `KILN_MODEL_BASE_URL` names the OpenAI one.
    #[arg(long, env = "KILN_ANTHROPIC_BASE_URL")]
    pub anthropic_base_url: Option<String>,
    /// Local model (`KILN_MODEL_PROVIDER=local`, and `kiln up` with no model
    /// configured): a GGUF file to serve instead of the bundled SmolLM2-135M.
    #[arg(long, env = "KILN_LOCAL_MODEL")]
    pub local_model: Option<PathBuf>,
    /// Local model: port on 127.0.0.1 (default: a free one).
    #[arg(long, env = "KILN_LOCAL_MODEL_PORT")]
    pub local_model_port: Option<u16>,
    /// Local model: chat template. `kiln` (Kiln's tool-calling template for
    /// ChatML models), `model` (the GGUF file's own) or a Jinja file.
    #[arg(long, env = "KILN_LOCAL_MODEL_TEMPLATE", default_value = "kiln")]
    pub local_model_template: String,
    /// Local model: output token limit per model call.
    #[arg(long, env = "KILN_LOCAL_MODEL_MAX_TOKENS", default_value_t = crate::local_model::DEFAULT_MAX_TOKENS)]
    pub local_model_max_tokens: u32,
}

impl ModelArgs {
    /// The wire format the worker speaks. A model `kiln up` serves itself has
    /// none until `up` has started it and pointed these settings at it.
    pub fn provider(&self) -> anyhow::Result<ProviderKind> {
        match self.model_provider {
            ModelSource::Server(kind) => Ok(kind),
            source @ (ModelSource::Local | ModelSource::Scripted) => bail!(
                "KILN_MODEL_PROVIDER={source} is served by `kiln up`; for a separate worker, run the model server \
                 yourself and set KILN_MODEL_BASE_URL (see local-model/README.md)"
            ),
        }
    }

    /// True when the user configured a model of their own.
    pub fn is_configured(&self) -> bool {
        self.model_base_url.is_some() || self.openai_api_key.is_some() || self.anthropic_api_key.is_some()
    }

    /// Where and what the local model serves, with its state under `state_dir`.
    pub fn local_model_options(&self, state_dir: &std::path::Path) -> crate::local_model::Options {
        crate::local_model::Options {
            model: self.local_model.clone(),
            template: crate::local_model::Template::parse(&self.local_model_template),
            port: self.local_model_port,
            ..crate::local_model::Options::new(state_dir)
        }
    }

    pub fn endpoints(&self) -> anyhow::Result<ProviderEndpoints> {
        // KILN_MODEL_BASE_URL belongs to the selected provider.
        let (openai_base_url, anthropic_base_url) = match self.provider()? {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses => {
                (self.model_base_url.clone(), self.anthropic_base_url.clone())
            }
            ProviderKind::Anthropic => (None, self.model_base_url.clone().or(self.anthropic_base_url.clone())),
        };
        Ok(ProviderEndpoints {
            openai_base_url,
            openai_api_key: self.openai_api_key.clone(),
            anthropic_base_url,
            anthropic_api_key: self.anthropic_api_key.clone(),
            read_timeout: Some(std::time::Duration::from_secs(self.model_read_timeout_s.max(1))),
        })
    }
}
