//! `X-Hub-Signature-256`: `sha256=` and the hex HMAC-SHA256 of the raw body,
//! keyed with the webhook's secret. Checked before the body is parsed, in
//! constant time.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const PREFIX: &str = "sha256=";

/// The webhook secret, held as a keyed MAC ready to clone per request.
/// Its `Debug` prints no key: `Hmac`'s own prints `Hmac { ... }`.
#[derive(Debug, Clone)]
pub struct WebhookSecret {
    mac: Hmac<Sha256>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing X-Hub-Signature-256 header")]
    Missing,
    #[error("X-Hub-Signature-256 must be `sha256=` followed by 64 hex digits")]
    Malformed,
    #[error("X-Hub-Signature-256 does not match the body")]
    Mismatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the GitHub webhook secret must not be empty")]
pub struct EmptySecret;

impl WebhookSecret {
    pub fn new(secret: &[u8]) -> Result<Self, EmptySecret> {
        // An empty key is valid HMAC but signs nothing anyone couldn't forge.
        if secret.is_empty() {
            return Err(EmptySecret);
        }
        // HMAC takes keys of any length, so this cannot fail once non-empty.
        let mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| EmptySecret)?;
        Ok(WebhookSecret { mac })
    }

    /// Checks `header` (the `X-Hub-Signature-256` value, if any) against
    /// `body`. The digest comparison takes the same time wherever it differs.
    pub fn verify(&self, header: Option<&[u8]>, body: &[u8]) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let hex_digest = header.strip_prefix(PREFIX.as_bytes()).ok_or(SignatureError::Malformed)?;
        if hex_digest.len() != 64 {
            return Err(SignatureError::Malformed);
        }
        let tag = hex::decode(hex_digest).map_err(|_| SignatureError::Malformed)?;
        let mut mac = self.mac.clone();
        mac.update(body);
        // `verify_slice` also refuses a tag of the wrong length.
        mac.verify_slice(&tag).map_err(|_| SignatureError::Mismatch)
    }

    /// The `X-Hub-Signature-256` value GitHub would send for `body`: for
    /// tests and tools that play GitHub.
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(body);
        format!("{PREFIX}{}", hex::encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's documented test vector (fixtures/github/signature_vector.json).
    fn vector() -> serde_json::Value {
        let text = include_str!("../../../tests/fixtures/github/signature_vector.json");
        serde_json::from_str(text).unwrap()
    }

    fn field<'a>(v: &'a serde_json::Value, name: &str) -> &'a str {
        v[name].as_str().unwrap()
    }

    #[test]
    fn github_documented_vector_verifies() {
        let v = vector();
        let secret = WebhookSecret::new(field(&v, "secret").as_bytes()).unwrap();
        let payload = field(&v, "payload").as_bytes();
        assert_eq!(secret.sign(payload), field(&v, "header_value"));
        assert_eq!(secret.verify(Some(field(&v, "header_value").as_bytes()), payload), Ok(()));
        // Upper-case hex is the same digest.
        let upper = format!("sha256={}", field(&v, "signature").to_uppercase());
        assert_eq!(secret.verify(Some(upper.as_bytes()), payload), Ok(()));
    }

    #[test]
    fn anything_else_is_refused() {
        let v = vector();
        let secret = WebhookSecret::new(field(&v, "secret").as_bytes()).unwrap();
        let payload = field(&v, "payload").as_bytes();
        let good = field(&v, "header_value");
        let digest = field(&v, "signature");
        assert_eq!(secret.verify(None, payload), Err(SignatureError::Missing));
        assert_eq!(secret.verify(Some(good.as_bytes()), b"Hello, World?"), Err(SignatureError::Mismatch));
        let other = WebhookSecret::new(b"another secret").unwrap();
        assert_eq!(other.verify(Some(good.as_bytes()), payload), Err(SignatureError::Mismatch));
        // The vector's digest ends in 7: flip its last digit.
        let flipped = format!("sha256={}0", &digest[..63]);
        assert_ne!(flipped, good);
        assert_eq!(secret.verify(Some(flipped.as_bytes()), payload), Err(SignatureError::Mismatch));
        let malformed = [
            digest.to_owned(),
            format!("sha1={digest}"),
            format!("SHA256={digest}"),
            format!("sha256={}", &digest[..62]),
            format!("{good}00"),
            format!("sha256={}zz", &digest[..62]),
            "sha256=".to_owned(),
        ];
        for header in malformed {
            assert_eq!(secret.verify(Some(header.as_bytes()), payload), Err(SignatureError::Malformed), "{header}");
        }
    }

    #[test]
    fn empty_secret_is_refused_and_secrets_never_print() {
        assert!(WebhookSecret::new(b"").is_err());
        let secret = WebhookSecret::new(b"hunter2").unwrap();
        assert!(!format!("{secret:?}").contains("hunter2"));
    }
}
