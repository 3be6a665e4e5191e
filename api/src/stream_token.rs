//! Stream tokens: short-lived, one-run credentials for `?access_token=`.
//!
//! Browsers' EventSource cannot set headers, so the web view must put a
//! credential in the events URL, where proxies and access logs keep it. A
//! long-lived bearer token there would be a leaked account; a stream token
//! only reads one run's events, for a few minutes
//! (`ApiSettings::stream_token_ttl`).
//!
//! The token is opaque to clients: `kst1.<run id>.<expiry, unix ms>.<hex of
//! the subject>.<hex HMAC-SHA256 of what precedes it>`, keyed by a key of
//! its own (derived from the JWT secret, or set with
//! `KILN_STREAM_TOKEN_SECRET`), so it can never pass as a bearer JWT and a
//! JWT can never pass as one of these.

use chrono::{DateTime, TimeZone, Utc};
use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use uuid::Uuid;

use crate::ApiError;

/// Every stream token starts with this (the scheme's version).
pub const PREFIX: &str = "kst1.";
/// The label a key is derived from the JWT secret under.
const DERIVATION_LABEL: &[u8] = b"kiln-stream-token-v1";

/// Mints and checks stream tokens with one key.
#[derive(Debug, Clone)]
pub struct StreamTokenKey(SecretSlice<u8>);

/// What a valid stream token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamGrant {
    pub run_id: Uuid,
    pub subject: String,
}

impl StreamTokenKey {
    /// A key used as given (`KILN_STREAM_TOKEN_SECRET`, at least 32 bytes).
    pub fn new(key: &[u8]) -> Self {
        StreamTokenKey(key.to_vec().into())
    }

    /// The key derived from the HS256 JWT secret: every API replica with the
    /// same secret agrees on it, and it is not the secret itself (a stream
    /// token is no JWT).
    pub fn derived_from(jwt_secret: &[u8]) -> Self {
        let mut mac = hmac(jwt_secret);
        mac.update(DERIVATION_LABEL);
        StreamTokenKey::new(&mac.finalize().into_bytes())
    }

    /// A random key: only this process can check its tokens (public-key JWT
    /// deployments without `KILN_STREAM_TOKEN_SECRET`; with several API
    /// replicas, set that).
    pub fn random() -> Self {
        StreamTokenKey::new(&rand::random::<[u8; 32]>())
    }

    /// A token for `subject` to read `run_id`'s events until `expires_at`.
    pub fn mint(&self, run_id: Uuid, subject: &str, expires_at: DateTime<Utc>) -> String {
        let payload = format!("{PREFIX}{run_id}.{}.{}", expires_at.timestamp_millis(), hex::encode(subject));
        let mut mac = hmac(self.0.expose_secret());
        mac.update(payload.as_bytes());
        format!("{payload}.{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Checks the tag and the expiry (no leeway: the clock that minted it is
    /// the clock that checks it, or a replica's, kept in sync by NTP).
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<StreamGrant, ApiError> {
        let malformed = || ApiError::Unauthorized("stream token is malformed".into());
        let (payload, tag) = token.rsplit_once('.').ok_or_else(malformed)?;
        let tag = hex::decode(tag).map_err(|_| malformed())?;
        let mut mac = hmac(self.0.expose_secret());
        mac.update(payload.as_bytes());
        mac.verify_slice(&tag).map_err(|_| ApiError::Unauthorized("stream token signature is invalid".into()))?;
        // Signed by us: what follows can only fail on a token minted by a
        // different version.
        let rest = payload.strip_prefix(PREFIX).ok_or_else(malformed)?;
        let mut parts = rest.split('.');
        let (Some(run), Some(expiry), Some(subject), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        let run_id = Uuid::parse_str(run).map_err(|_| malformed())?;
        let expiry: i64 = expiry.parse().map_err(|_| malformed())?;
        let subject = hex::decode(subject).ok().and_then(|s| String::from_utf8(s).ok()).ok_or_else(malformed)?;
        let expires_at = Utc.timestamp_millis_opt(expiry).single().ok_or_else(malformed)?;
        if now >= expires_at {
            return Err(ApiError::Unauthorized(
                "stream token has expired; mint another with POST /v1/runs/{id}/stream-token".into(),
            ));
        }
        Ok(StreamGrant { run_id, subject })
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC-SHA256 accepts keys of any length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_until_it_expires_and_only_under_its_key() {
        let key = StreamTokenKey::derived_from(b"0123456789abcdef0123456789abcdef");
        let run = Uuid::new_v4();
        let now = Utc::now();
        let token = key.mint(run, "alice", now + chrono::Duration::seconds(60));
        assert_eq!(key.verify(&token, now).unwrap(), StreamGrant { run_id: run, subject: "alice".into() });
        assert!(key.verify(&token, now + chrono::Duration::seconds(60)).is_err(), "no leeway");
        assert!(StreamTokenKey::random().verify(&token, now).is_err());
        let other = key.mint(run, "bob", now + chrono::Duration::seconds(60));
        let spliced = format!("{}.{}", token.rsplit_once('.').unwrap().0.replace("616c696365", "626f62"), "00");
        assert!(key.verify(&spliced, now).is_err());
        assert_ne!(token, other);
    }
}
