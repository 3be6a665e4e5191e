//! Bearer JWT authentication.
//!
//! Tokens are verified with one configured key (HS256 secret, or an RS256 /
//! EdDSA public key). `exp` is required; `alg: none` and any algorithm other
//! than the configured one are refused. The token's `sub` owns the runs it
//! creates.
//!
//! `?access_token=` takes a stream token only (`crate::stream_token`), on its
//! run's events route only: a long-lived token in a URL ends up in proxy
//! and access logs.

use std::time::Duration;

use axum::extract::{FromRequestParts, Query};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, encode};
use secrecy::{ExposeSecret, SecretSlice};
use serde::{Deserialize, Serialize};

use crate::stream_token::{self, StreamTokenKey};
use crate::{ApiError, AppState};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

/// What `verify` reads from a token; the library checks the rest.
#[derive(Deserialize)]
struct Verified {
    #[serde(default)]
    sub: String,
}

/// How tokens are checked.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    Hs256 {
        secret: SecretSlice<u8>,
    },
    /// RS256 or EdDSA with a PEM public key.
    PublicKey {
        algorithm: Algorithm,
        pem: Vec<u8>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("KILN_JWT_SECRET must be at least 32 bytes")]
    WeakSecret,
    #[error("KILN_STREAM_TOKEN_SECRET must be at least 32 bytes")]
    WeakStreamKey,
    #[error("invalid public key: {0}")]
    Key(String),
    #[error("unsupported algorithm {0:?}: use RS256 or EdDSA for public keys")]
    Algorithm(Algorithm),
}

pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
    /// Mints and checks stream tokens.
    stream: StreamTokenKey,
}

impl Authenticator {
    pub fn new(config: &AuthConfig, issuer: Option<&str>, audience: Option<&str>) -> Result<Self, AuthSetupError> {
        // Stream tokens: a key derived from the HS256 secret (every replica
        // agrees), or a random one until `with_stream_key` sets a shared one.
        let (key, algorithm, stream) = match config {
            AuthConfig::Hs256 { secret } => {
                let secret = secret.expose_secret();
                if secret.len() < 32 {
                    return Err(AuthSetupError::WeakSecret);
                }
                let key = DecodingKey::from_secret(secret).map_err(|e| AuthSetupError::Key(e.to_string()))?;
                (key, Algorithm::HS256, StreamTokenKey::derived_from(secret))
            }
            AuthConfig::PublicKey { algorithm: Algorithm::RS256, pem } => {
                let key = DecodingKey::from_rsa_pem(pem).map_err(|e| AuthSetupError::Key(e.to_string()))?;
                (key, Algorithm::RS256, StreamTokenKey::random())
            }
            AuthConfig::PublicKey { algorithm: Algorithm::EdDSA, pem } => {
                let key = DecodingKey::from_ed_pem(pem).map_err(|e| AuthSetupError::Key(e.to_string()))?;
                (key, Algorithm::EdDSA, StreamTokenKey::random())
            }
            AuthConfig::PublicKey { algorithm, .. } => return Err(AuthSetupError::Algorithm(*algorithm)),
        };
        let mut validation = Validation::new(algorithm);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = 5;
        if let Some(iss) = issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        match audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        Ok(Authenticator { key, validation, stream })
    }

    /// Signs and checks stream tokens with `key` (`KILN_STREAM_TOKEN_SECRET`,
    /// for several API replicas that verify JWTs with a public key).
    pub fn with_stream_key(self, key: &[u8]) -> Result<Self, AuthSetupError> {
        if key.len() < 32 {
            return Err(AuthSetupError::WeakStreamKey);
        }
        Ok(Authenticator { stream: StreamTokenKey::new(key), ..self })
    }

    /// The stream-token key.
    pub fn stream_tokens(&self) -> &StreamTokenKey {
        &self.stream
    }

    /// Verifies a token and returns its subject.
    pub fn verify(&self, token: &str) -> Result<String, ApiError> {
        // Decoded into `Verified`, which requires nothing itself, so that a
        // missing `exp` or `sub` is reported by the claim checks by name.
        let data = decode::<Verified>(token, &self.key, &self.validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            let why = match e.kind() {
                ErrorKind::ExpiredSignature => "token has expired",
                ErrorKind::InvalidSignature => "token signature is invalid",
                ErrorKind::InvalidAlgorithm => "token algorithm is not accepted",
                ErrorKind::MissingRequiredClaim(claim) if claim == "exp" => "token has no exp claim; exp is required",
                ErrorKind::MissingRequiredClaim(claim) if claim == "sub" => "token has no sub claim; sub is required",
                ErrorKind::MissingRequiredClaim(_) => "token lacks a required claim",
                ErrorKind::ImmatureSignature => "token is not valid yet (nbf)",
                ErrorKind::InvalidIssuer => "token issuer is not accepted",
                ErrorKind::InvalidAudience => "token audience is not accepted",
                _ => "token is malformed",
            };
            ApiError::Unauthorized(why.into())
        })?;
        // The subject is stored and matched as text: Postgres refuses a NUL
        // (a 500 on every query), and control characters have no business
        // in an identity.
        let sub = &data.claims.sub;
        if sub.is_empty() || sub.len() > 256 || sub.chars().any(char::is_control) {
            return Err(ApiError::Unauthorized(
                "token subject must be 1 to 256 bytes without control characters".into(),
            ));
        }
        Ok(data.claims.sub)
    }
}

/// Signs an HS256 token for `sub` valid for `ttl` (`kiln token`, tests).
pub fn mint_hs256(secret: &[u8], sub: &str, ttl: Duration) -> Result<String, jsonwebtoken::errors::Error> {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims { sub: sub.to_owned(), exp: now + ttl.as_secs(), iat: Some(now), iss: None, aud: None };
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret)?)
}

/// The authenticated subject of a request.
#[derive(Debug, Clone)]
pub struct Subject(pub String);

impl FromRequestParts<AppState> for Subject {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match credential(parts)? {
            Credential::Bearer(token) => {
                if token.starts_with(stream_token::PREFIX) {
                    return Err(ApiError::Unauthorized(
                        "a stream token is accepted only as ?access_token= on its run's events route".into(),
                    ));
                }
                state.auth.verify(&token).map(Subject)
            }
            Credential::Stream { token, run } => {
                let grant = state.auth.stream_tokens().verify(&token, chrono::Utc::now())?;
                if Some(grant.run_id) != run {
                    return Err(ApiError::Unauthorized("this stream token is for another run".into()));
                }
                Ok(Subject(grant.subject))
            }
        }
    }
}

/// What a request authenticates with.
enum Credential {
    /// `Authorization: Bearer …`: a JWT.
    Bearer(String),
    /// `?access_token=` on the events route of `run` (`None`: the path's id
    /// is no UUID): a stream token.
    Stream { token: String, run: Option<uuid::Uuid> },
}

/// The token from `Authorization: Bearer …`, or for browsers' EventSource
/// (which cannot set headers) a stream token from `?access_token=` on the
/// events route. A query token anywhere else is not looked at.
fn credential(parts: &Parts) -> Result<Credential, ApiError> {
    if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let value =
            value.to_str().map_err(|_| ApiError::Unauthorized("Authorization header is not valid text".into()))?;
        let (scheme, token) = value
            .split_once(' ')
            .ok_or_else(|| ApiError::Unauthorized("Authorization header must be `Bearer <token>`".into()))?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(ApiError::Unauthorized("Authorization header must be `Bearer <token>`".into()));
        }
        return Ok(Credential::Bearer(token.trim().to_owned()));
    }
    if let Some(run) = events_route_run(parts.uri.path())
        && let Ok(q) = Query::<AccessTokenQuery>::try_from_uri(&parts.uri)
        && let Some(token) = q.0.access_token
    {
        if !token.starts_with(stream_token::PREFIX) {
            return Err(ApiError::Unauthorized(
                "?access_token= takes a stream token from POST /v1/runs/{id}/stream-token; \
                 send other tokens as `Authorization: Bearer <token>`"
                    .into(),
            ));
        }
        return Ok(Credential::Stream { token, run: uuid::Uuid::parse_str(run).ok() });
    }
    Err(ApiError::Unauthorized("missing bearer token".into()))
}

/// The id in `…/runs/{id}/events`, the one route EventSource clients call.
/// (Inside the nested `/v1` router the prefix is already stripped.)
fn events_route_run(path: &str) -> Option<&str> {
    let segments: Vec<&str> = path.rsplitn(4, '/').collect();
    match segments.as_slice() {
        ["events", id, "runs", _] if !id.is_empty() => Some(id),
        _ => None,
    }
}

#[derive(Deserialize)]
struct AccessTokenQuery {
    access_token: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn auth() -> Authenticator {
        Authenticator::new(&AuthConfig::Hs256 { secret: SECRET.to_vec().into() }, None, None).unwrap()
    }

    #[test]
    fn minted_token_verifies_to_its_subject() {
        let t = mint_hs256(SECRET, "alice", Duration::from_secs(60)).unwrap();
        assert_eq!(auth().verify(&t).unwrap(), "alice");
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(matches!(
            Authenticator::new(&AuthConfig::Hs256 { secret: b"short".to_vec().into() }, None, None),
            Err(AuthSetupError::WeakSecret)
        ));
    }

    #[test]
    fn issuer_is_checked_when_configured() {
        let a = Authenticator::new(&AuthConfig::Hs256 { secret: SECRET.to_vec().into() }, Some("kiln"), None).unwrap();
        let t = mint_hs256(SECRET, "alice", Duration::from_secs(60)).unwrap();
        assert!(a.verify(&t).is_err());
    }

    #[test]
    fn only_the_events_route_takes_a_query_token() {
        assert_eq!(events_route_run("/v1/runs/0199/events"), Some("0199"));
        assert_eq!(events_route_run("/runs/0199/events"), Some("0199"));
        assert_eq!(events_route_run("/v1/runs/events"), None);
        assert_eq!(events_route_run("/v1/runs//events"), None);
        assert_eq!(events_route_run("/v1/runs/0199"), None);
        assert_eq!(events_route_run("/v1/runs/0199/cancel"), None);
    }

    // Test-only Ed25519 keys (generated with `openssl genpkey -algorithm ed25519`).
    const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFuQWXYuxZ1GVqtb5tgPsg3rvrXB1F8jbYnGKbpX7Csl\n-----END PRIVATE KEY-----\n";
    const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAJkBAD97EDG8wEFRFijUsKgTQ+4+P6tTK0Qu3fhP356Y=\n-----END PUBLIC KEY-----\n";
    const ED_OTHER_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIPhrUMmsLtwp9ldN5w/VF02H57UydoaBXvOKuNdKEMD+\n-----END PRIVATE KEY-----\n";

    fn eddsa_token(private_pem: &str, sub: &str) -> String {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = Claims { sub: sub.into(), exp: now + 60, iat: None, iss: None, aud: None };
        let key = EncodingKey::from_ed_pem(private_pem.as_bytes()).unwrap();
        encode(&Header::new(Algorithm::EdDSA), &claims, &key).unwrap()
    }

    #[test]
    fn eddsa_public_keys_verify_their_tokens_and_refuse_others() {
        let config = AuthConfig::PublicKey { algorithm: Algorithm::EdDSA, pem: ED_PUBLIC.as_bytes().to_vec() };
        let a = Authenticator::new(&config, None, None).unwrap();
        assert_eq!(a.verify(&eddsa_token(ED_PRIVATE, "carol")).unwrap(), "carol");
        assert!(a.verify(&eddsa_token(ED_OTHER_PRIVATE, "carol")).is_err(), "another key's signature");
        // An HS256 token cannot pass where a public key is configured.
        let hs = mint_hs256(SECRET, "carol", Duration::from_secs(60)).unwrap();
        assert!(a.verify(&hs).is_err());
    }

    #[test]
    fn an_invalid_public_key_is_a_setup_error() {
        let config = AuthConfig::PublicKey { algorithm: Algorithm::RS256, pem: b"not a key".to_vec() };
        assert!(matches!(Authenticator::new(&config, None, None), Err(AuthSetupError::Key(_))));
    }
}
