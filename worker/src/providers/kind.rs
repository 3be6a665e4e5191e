//! Which wire format a model server speaks: named by a run's
//! `model.provider` and the worker's settings.

/// The wire format a worker speaks to a model server. Named as a run's
/// `model.provider` and `KILN_MODEL_PROVIDER` name it ([`ProviderKind::name`],
/// parsed back with `str::parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (and compatible servers).
    OpenAi,
    /// The OpenAI Responses API, at the same base URL and key as `OpenAi`.
    OpenAiResponses,
    Anthropic,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] = [ProviderKind::OpenAi, ProviderKind::OpenAiResponses, ProviderKind::Anthropic];

    /// The name runs and settings use.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::OpenAiResponses => "openai-responses",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A provider name that is none of [`ProviderKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown model provider {0:?}: expected openai, openai-responses or anthropic")]
pub struct UnknownProvider(pub String);

impl std::str::FromStr for ProviderKind {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderKind::ALL.into_iter().find(|kind| kind.name() == s).ok_or_else(|| UnknownProvider(s.to_owned()))
    }
}
