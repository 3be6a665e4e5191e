//! One attempt at a callback: vet the target, sign the body, POST it, and
//! say what came of it.

use std::time::Duration;

use chrono::Utc;
use kiln_protocol::callback::{
    DELIVERY_HEADER, EVENT_HEADER, KEY_ID, SIGNATURE_HEADER, SIGNATURE_KEY_HEADER, TIMESTAMP_HEADER, signature,
};
use kiln_protocol::{CallbackBody, Run};
use uuid::Uuid;

use super::target::{self, TargetError};
use crate::providers::error::retry_after_from_headers;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A 2xx.
    Delivered { status: u16 },
    /// Not delivered. `retryable`: a later attempt could fare better
    /// (connection error, timeout, 408, 429, 5xx). `retry_after`: what the
    /// receiver asked for.
    Failed { status: Option<u16>, error: String, retryable: bool, retry_after: Option<Duration> },
}

/// The fixed parts of every attempt.
pub struct Request<'a> {
    pub url: &'a str,
    pub run: &'a Run,
    /// The run's owner, named in the body.
    pub owner: &'a str,
    pub event: &'a str,
    pub delivery_id: Uuid,
    /// The owner's callback key (`kiln_protocol::callback::subject_key`),
    /// never the deployment's secret: a tenant verifies with its own key
    /// and cannot sign for another.
    pub key: &'a [u8],
    pub allow_private: bool,
    pub timeout: Duration,
}

pub async fn attempt(req: &Request<'_>) -> Sent {
    let target = match target::resolve(req.url, req.allow_private).await {
        Ok(target) => target,
        Err(e) => return refused(&e),
    };
    let now = Utc::now();
    let body = CallbackBody {
        event: req.event.to_owned(),
        delivery_id: req.delivery_id,
        sent_at: now,
        owner: req.owner.to_owned(),
        run: req.run.clone(),
    };
    let body = match serde_json::to_vec(&body) {
        Ok(body) => body,
        Err(e) => return failed(None, format!("encoding the callback: {e}"), false),
    };
    let signature = signature(req.key, &body);
    let client = match pinned_client(&target, req.timeout) {
        Ok(client) => client,
        Err(e) => return failed(None, format!("building the HTTP client: {e}"), false),
    };
    let response = client
        .post(target.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature)
        .header(SIGNATURE_KEY_HEADER, KEY_ID)
        .header(DELIVERY_HEADER, req.delivery_id.to_string())
        .header(EVENT_HEADER, req.event)
        .header(TIMESTAMP_HEADER, now.timestamp().to_string())
        .body(body)
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        // Unanswered (refused, reset, timed out): worth another try.
        Err(e) => return failed(None, describe(&e), true),
    };
    answered(&response)
}

/// A client that goes to `target`'s vetted addresses only.
fn pinned_client(target: &target::Target, timeout: Duration) -> reqwest::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        // Straight to the vetted address: no proxy from the environment,
        // no redirect to somewhere unvetted.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .timeout(timeout)
        .user_agent(concat!("kiln-callbacks/", env!("CARGO_PKG_VERSION")));
    if let Some(domain) = &target.domain {
        builder = builder.resolve_to_addrs(domain, &target.addrs);
    }
    builder.build()
}

/// What the receiver's answer means: delivered, or failed and whether (and
/// when) to try again.
fn answered(response: &reqwest::Response) -> Sent {
    let status = response.status();
    if status.is_success() {
        return Sent::Delivered { status: status.as_u16() };
    }
    let retry_after = retry_after_from_headers(response.headers(), Utc::now());
    let code = status.as_u16();
    let (retryable, error) = if status.is_redirection() {
        (false, format!("answered {status}; redirects are not followed"))
    } else if code == 408 || code == 429 || status.is_server_error() {
        (true, format!("answered {status}"))
    } else {
        (false, format!("answered {status}; not retried"))
    };
    Sent::Failed { status: Some(code), error, retryable, retry_after }
}

fn refused(e: &TargetError) -> Sent {
    if let TargetError::NotPublic { host, addr, kind } = e {
        // The operator may want the address; the user's event does not get it.
        tracing::warn!(%host, %addr, kind, "refused a callback to a non-public address");
    }
    failed(None, e.to_string(), e.is_transient())
}

fn failed(status: Option<u16>, error: String, retryable: bool) -> Sent {
    Sent::Failed { status, error, retryable, retry_after: None }
}

/// reqwest's top-level message hides the cause ("error sending request");
/// the chain says what happened (connection refused, timed out).
fn describe(e: &reqwest::Error) -> String {
    let mut out = if e.is_timeout() { "timed out".to_owned() } else { "request failed".to_owned() };
    let mut source = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    if let Some(cause) = last {
        out.push_str(": ");
        out.push_str(&cause);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_hmac() {
        // RFC 4231 test case 2.
        let sig = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn subjects_get_keys_of_their_own() {
        use kiln_protocol::callback::subject_key;
        let (alice, bob) = (subject_key(b"secret", "alice"), subject_key(b"secret", "bob"));
        assert_ne!(alice, bob);
        assert_ne!(alice, subject_key(b"other secret", "alice"));
        assert_eq!(alice, subject_key(b"secret", "alice"), "derived, not random");
    }
}
