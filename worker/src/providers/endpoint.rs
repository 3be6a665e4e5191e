//! Where a model API is and how to reach it: the part every wire format
//! shares. A provider builds its request body and decoder; the endpoint
//! sends the one with the key and feeds the answer to the other.

use reqwest::RequestBuilder;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use secrecy::{ExposeSecret, SecretString};

use super::sse::{self, Decoder};
use super::{ModelStream, ProviderError};

/// One model API: the HTTP client, its base URL and the key for it. The key
/// is a [`SecretString`], so the derived `Debug` prints it redacted.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub client: reqwest::Client,
    /// The API's root as its provider documents it, e.g.
    /// `https://api.openai.com/v1`; each wire format appends its path.
    pub base_url: String,
    /// `None` for servers that need no key (local servers, a proxy that
    /// adds its own).
    pub api_key: Option<SecretString>,
}

/// How a wire format sends the key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI and the servers that copy it).
    Bearer,
    /// The key alone in a header of this name (Anthropic's `x-api-key`).
    Named(&'static str),
}

impl Endpoint {
    pub fn new(client: reqwest::Client, base_url: impl Into<String>, api_key: Option<SecretString>) -> Self {
        Endpoint { client, base_url: base_url.into(), api_key }
    }

    /// The base URL without a trailing slash, ready for a path.
    pub(crate) fn base(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }

    /// A POST to `url` that carries the key as `key_header` says; the
    /// provider adds its body (and any header of its own).
    pub(crate) fn post(&self, url: &str, key_header: KeyHeader) -> RequestBuilder {
        let request = self.client.post(url);
        match (self.key(), key_header) {
            (None, _) => request,
            (Some(key), KeyHeader::Bearer) => request.bearer_auth(key),
            (Some(key), KeyHeader::Named(name)) => request.header(name, key),
        }
    }

    /// Sends a request made by [`Self::post`] and decodes the event stream
    /// it answers with.
    pub(crate) async fn stream(
        &self,
        request: RequestBuilder,
        decoder: impl Decoder,
    ) -> Result<ModelStream, ProviderError> {
        let response = open(request, self.key()).await?;
        Ok(sse::decode_stream(response.bytes_stream(), decoder))
    }

    fn key(&self) -> Option<&str> {
        self.api_key.as_ref().map(ExposeSecret::expose_secret)
    }
}

/// Sends a request that should answer with an event stream and returns the
/// response once it is known to be one. `secret` is the API key in use, so
/// error messages can be scrubbed of it.
async fn open(request: RequestBuilder, secret: Option<&str>) -> Result<reqwest::Response, ProviderError> {
    let response = request.header(ACCEPT, "text/event-stream").send().await?;
    if !response.status().is_success() {
        return Err(ProviderError::from_response(response, secret).await);
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if is_json {
        // Some proxies answer a streaming request with one JSON document,
        // often an error with status 200. Parsed as SSE it would look like an
        // empty, truncated stream and be retried forever.
        return Err(json_instead_of_stream(response).await);
    }
    Ok(response)
}

async fn json_instead_of_stream(response: reqwest::Response) -> ProviderError {
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(err) => return err.into(),
    };
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    match json {
        Some(json) if json.get("error").is_some_and(|e| !e.is_null()) => ProviderError::from_stream_error(&json),
        _ => ProviderError::Decode(
            "expected an event stream but got a JSON document; does this server support `stream: true`?".to_owned(),
        ),
    }
}
