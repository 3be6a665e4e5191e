//! Environment secrets at rest: sealed with the deployment's key
//! (`KILN_SECRETS_KEY`) by XChaCha20-Poly1305 (RustCrypto's
//! `chacha20poly1305`), a random 192-bit nonce per sealing, so nonces never
//! repeat in practice however many times secrets are written. The owner is
//! the associated data: a sealed value moved to another subject's row does
//! not open.

use std::collections::BTreeMap;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{KeyInit as _, Mac};
use secrecy::{ExposeSecret, SecretBox};
use zeroize::Zeroizing;

/// The setting holding the key.
pub const SECRETS_KEY_ENV: &str = "KILN_SECRETS_KEY";
const NONCE_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{SECRETS_KEY_ENV} must be 64 hexadecimal characters (32 bytes; e.g. `openssl rand -hex 32`)")]
    BadKey,
    /// Wrong key, or the stored value was altered: says nothing more.
    #[error("the environment's secrets do not open with this deployment's {SECRETS_KEY_ENV}")]
    Open,
    #[error("sealing secrets failed")]
    Seal,
}

/// The deployment's key. Its `Debug` prints nothing of it.
pub struct SecretsKey(SecretBox<[u8; 32]>);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

impl SecretsKey {
    /// The key from its setting's value: 64 hex digits.
    pub fn from_hex(text: &str) -> Result<SecretsKey, SecretsError> {
        let mut key = Box::new([0u8; 32]);
        hex::decode_to_slice(text.trim(), key.as_mut_slice()).map_err(|_| SecretsError::BadKey)?;
        Ok(SecretsKey(SecretBox::new(key)))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.0.expose_secret().into())
    }

    /// `secrets` as stored: nonce, then ciphertext of their JSON.
    pub fn seal(&self, owner: &str, secrets: &BTreeMap<String, String>) -> Result<Vec<u8>, SecretsError> {
        self.seal_with(owner.as_bytes(), secrets)
    }

    /// What [`SecretsKey::seal`] sealed for `owner`.
    pub fn open(&self, owner: &str, stored: &[u8]) -> Result<BTreeMap<String, String>, SecretsError> {
        self.open_with(owner.as_bytes(), stored)
    }

    /// The headers of `owner`'s MCP server `server`, as stored. The
    /// associated data names the server too: sealed headers moved to
    /// another server (or into the secrets column) do not open.
    pub fn seal_mcp_headers(
        &self,
        owner: &str,
        server: &str,
        headers: &BTreeMap<String, String>,
    ) -> Result<Vec<u8>, SecretsError> {
        self.seal_with(&mcp_aad(owner, server), headers)
    }

    /// What [`SecretsKey::seal_mcp_headers`] sealed.
    pub fn open_mcp_headers(
        &self,
        owner: &str,
        server: &str,
        stored: &[u8],
    ) -> Result<BTreeMap<String, String>, SecretsError> {
        self.open_with(&mcp_aad(owner, server), stored)
    }

    fn seal_with(&self, aad: &[u8], values: &BTreeMap<String, String>) -> Result<Vec<u8>, SecretsError> {
        let plain = Zeroizing::new(serde_json::to_vec(values).map_err(|_| SecretsError::Seal)?);
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self.cipher().encrypt(&nonce, Payload { msg: &plain, aad }).map_err(|_| SecretsError::Seal)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn open_with(&self, aad: &[u8], stored: &[u8]) -> Result<BTreeMap<String, String>, SecretsError> {
        if stored.len() < NONCE_BYTES {
            return Err(SecretsError::Open);
        }
        let (nonce, sealed) = stored.split_at(NONCE_BYTES);
        let plain = self
            .cipher()
            .decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad })
            .map_err(|_| SecretsError::Open)?;
        let plain = Zeroizing::new(plain);
        serde_json::from_slice(&plain).map_err(|_| SecretsError::Open)
    }

    /// A keyed hash of one secret (HMAC-SHA256 under a key derived from
    /// the deployment's): what the cache key holds, so a changed value
    /// misses without the value being recoverable from the key.
    pub fn fingerprint(&self, name: &str, value: &str) -> String {
        let mut mac = match hmac::Hmac::<sha2::Sha256>::new_from_slice(self.0.expose_secret()) {
            Ok(mac) => mac,
            // HMAC takes a key of any length.
            Err(_) => return String::new(),
        };
        mac.update(b"kiln-environment-secret\0");
        mac.update(name.as_bytes());
        mac.update(b"\0");
        mac.update(value.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// The associated data of an MCP server's headers: a prefix no owner's
/// name (the secrets' associated data) can equal, NUL-separated parts.
fn mcp_aad(owner: &str, server: &str) -> Vec<u8> {
    let mut aad = b"\0kiln-mcp-headers\0".to_vec();
    aad.extend_from_slice(owner.as_bytes());
    aad.push(0);
    aad.extend_from_slice(server.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretsKey {
        SecretsKey::from_hex(&"ab".repeat(32)).unwrap()
    }

    #[test]
    fn sealed_secrets_open_for_their_owner_only_and_hold_no_plaintext() {
        let secrets = BTreeMap::from([("TOKEN".to_owned(), "hunter2-hunter2".to_owned())]);
        let sealed = key().seal("alice", &secrets).unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(key().open("alice", &sealed).unwrap(), secrets);
        assert!(key().open("mallory", &sealed).is_err());
        let other = SecretsKey::from_hex(&"cd".repeat(32)).unwrap();
        assert!(other.open("alice", &sealed).is_err());
        // Two sealings of the same map differ (fresh nonce).
        assert_ne!(sealed, key().seal("alice", &secrets).unwrap());
    }

    #[test]
    fn mcp_headers_open_for_their_owner_and_server_only() {
        let headers = BTreeMap::from([("Authorization".to_owned(), "Bearer hunter2".to_owned())]);
        let sealed = key().seal_mcp_headers("alice", "demo", &headers).unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(key().open_mcp_headers("alice", "demo", &sealed).unwrap(), headers);
        assert!(key().open_mcp_headers("alice", "other", &sealed).is_err());
        assert!(key().open_mcp_headers("mallory", "demo", &sealed).is_err());
        assert!(key().open("alice", &sealed).is_err());
    }

    #[test]
    fn keys_are_64_hex_digits_and_fingerprints_follow_the_value() {
        assert!(SecretsKey::from_hex("short").is_err());
        assert!(SecretsKey::from_hex(&"zz".repeat(32)).is_err());
        let k = key();
        assert_eq!(k.fingerprint("A", "1"), k.fingerprint("A", "1"));
        assert_ne!(k.fingerprint("A", "1"), k.fingerprint("A", "2"));
        assert_ne!(k.fingerprint("A", "1"), SecretsKey::from_hex(&"cd".repeat(32)).unwrap().fingerprint("A", "1"));
        assert!(!format!("{k:?}").contains("ab"));
    }
}
