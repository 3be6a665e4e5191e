//! The model endpoints a worker can reach, built once from where each API
//! is and the key for it.

use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

use super::ModelProvider;
use super::anthropic::{self, Anthropic};
use super::endpoint::Endpoint;
use super::kind::ProviderKind;
use super::openai_chat::{self, OpenAiChat};
use super::openai_responses::OpenAiResponses;

/// The model endpoints a worker can reach, built once.
#[derive(Clone)]
pub struct Providers {
    pub openai: Arc<dyn ModelProvider>,
    pub responses: Arc<dyn ModelProvider>,
    pub anthropic: Arc<dyn ModelProvider>,
}

/// Where each provider is and the keys for it. Keys are only ever sent to
/// these configured URLs, never to one named in a run.
#[derive(Debug, Clone, Default)]
pub struct ProviderEndpoints {
    pub openai_base_url: Option<String>,
    pub openai_api_key: Option<SecretString>,
    pub anthropic_base_url: Option<String>,
    pub anthropic_api_key: Option<SecretString>,
    /// Longest wait for the next bytes of a model response (the first
    /// included); a model that stalls longer fails the attempt, which is
    /// retried. `None`: [`DEFAULT_MODEL_READ_TIMEOUT`].
    pub read_timeout: Option<Duration>,
}

/// Default of [`ProviderEndpoints::read_timeout`]: long enough for a slow
/// local model reading a long prompt, short enough to notice a dead stream.
pub const DEFAULT_MODEL_READ_TIMEOUT: Duration = Duration::from_secs(300);

impl Providers {
    pub fn new(endpoints: ProviderEndpoints) -> Result<Self, reqwest::Error> {
        // reqwest is built without a TLS backend of its own choosing; make
        // sure one is installed (a no-op when the binary already did).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // Between two chunks of a stream; a stalled stream fails and is retried.
            .read_timeout(endpoints.read_timeout.unwrap_or(DEFAULT_MODEL_READ_TIMEOUT))
            .build()?;
        // Chat Completions and Responses are two APIs of one endpoint.
        let openai = Endpoint::new(
            client.clone(),
            endpoints.openai_base_url.unwrap_or_else(|| openai_chat::DEFAULT_BASE_URL.to_owned()),
            endpoints.openai_api_key,
        );
        let anthropic = Endpoint::new(
            client,
            endpoints.anthropic_base_url.unwrap_or_else(|| anthropic::DEFAULT_BASE_URL.to_owned()),
            endpoints.anthropic_api_key,
        );
        Ok(Providers {
            openai: Arc::new(OpenAiChat::new(openai.clone())),
            responses: Arc::new(OpenAiResponses::new(openai)),
            anthropic: Arc::new(Anthropic::new(anthropic)),
        })
    }

    pub fn get(&self, kind: ProviderKind) -> Arc<dyn ModelProvider> {
        match kind {
            ProviderKind::OpenAi => self.openai.clone(),
            ProviderKind::OpenAiResponses => self.responses.clone(),
            ProviderKind::Anthropic => self.anthropic.clone(),
        }
    }
}
