//! Environment secrets and MCP servers' headers at rest: sealed with a key
//! derived from the deployment's (`KILN_SECRETS_KEY`) by XChaCha20-Poly1305
//! (RustCrypto's `chacha20poly1305`), a random 192-bit nonce per sealing,
//! so nonces never repeat in practice however many times values are
//! written.
//!
//! The associated data binds a sealed value to where it belongs
//! ([`Sealed`]): the owner, the environment's id (stable across renames)
//! and the field (the secrets, or one named MCP server's headers). A value
//! moved to another subject's row, another environment of the same
//! subject, another server or the other column does not open.
//!
//! Keys per purpose: the sealing key and the fingerprint key are derived
//! from `KILN_SECRETS_KEY` by HKDF-SHA256 with distinct info strings, so
//! the cache key's fingerprints never come from the key that encrypts, and
//! one purpose's key says nothing of another's.
//!
//! Two formats are read. New values start with [`FORMAT_V2`], then the
//! nonce and the ciphertext, under the derived key and the full binding.
//! Values written before (no version byte: nonce, then ciphertext) were
//! sealed under `KILN_SECRETS_KEY` itself with only the owner (and, for
//! headers, the server) as associated data; they still open, so existing
//! deployments lose nothing, and the API seals them again in the new
//! format the next time their environment is written (`PUT`). Until then
//! such a value is bound as loosely as it was when written.

use std::collections::BTreeMap;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{KeyInit as _, Mac};
use secrecy::{ExposeSecret, SecretBox};
use uuid::Uuid;
use zeroize::Zeroizing;

/// The setting holding the key.
pub const SECRETS_KEY_ENV: &str = "KILN_SECRETS_KEY";
/// The first byte of a value sealed in the current format.
pub const FORMAT_V2: u8 = 2;
const NONCE_BYTES: usize = 24;
/// HKDF info strings: one per purpose, never reused for another.
const SEALING_INFO: &[u8] = b"kiln/secrets/v2/sealing";
const FINGERPRINT_INFO: &[u8] = b"kiln/secrets/v2/fingerprint";

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{SECRETS_KEY_ENV} must be 64 hexadecimal characters (32 bytes; e.g. `openssl rand -hex 32`)")]
    BadKey,
    /// Wrong key, or the stored value was altered or moved: says nothing more.
    #[error("the environment's secrets do not open with this deployment's {SECRETS_KEY_ENV}")]
    Open,
    #[error("sealing secrets failed")]
    Seal,
}

/// Which of an environment's sealed values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    /// The environment's secrets.
    Secrets,
    /// The headers of its MCP server of this name.
    McpHeaders(&'a str),
}

/// Where a sealed value belongs: what its associated data binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    /// The environment's owner (the JWT subject).
    pub owner: &'a str,
    /// The environment's id.
    pub environment: Uuid,
    pub field: Field<'a>,
}

impl<'a> Sealed<'a> {
    /// The environment's secrets.
    pub fn secrets(owner: &'a str, environment: Uuid) -> Self {
        Sealed { owner, environment, field: Field::Secrets }
    }

    /// The headers of the environment's MCP server `server`.
    pub fn mcp_headers(owner: &'a str, environment: Uuid, server: &'a str) -> Self {
        Sealed { owner, environment, field: Field::McpHeaders(server) }
    }

    /// The current format's associated data: a tag, then each part with
    /// its length, so no two bindings share bytes however their parts are
    /// spelled.
    fn aad(&self) -> Vec<u8> {
        let mut aad = b"kiln-sealed-v2".to_vec();
        let mut part = |bytes: &[u8]| {
            aad.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            aad.extend_from_slice(bytes);
        };
        part(self.owner.as_bytes());
        part(self.environment.as_bytes());
        match self.field {
            Field::Secrets => part(b"secrets"),
            Field::McpHeaders(server) => {
                part(b"mcp-headers");
                part(server.as_bytes());
            }
        }
        aad
    }

    /// The associated data values were sealed with before [`FORMAT_V2`]:
    /// the owner for secrets; a prefix no owner can equal, the owner and
    /// the server for headers.
    fn legacy_aad(&self) -> Vec<u8> {
        match self.field {
            Field::Secrets => self.owner.as_bytes().to_vec(),
            Field::McpHeaders(server) => {
                let mut aad = b"\0kiln-mcp-headers\0".to_vec();
                aad.extend_from_slice(self.owner.as_bytes());
                aad.push(0);
                aad.extend_from_slice(server.as_bytes());
                aad
            }
        }
    }
}

/// The deployment's key and the keys derived from it. Its `Debug` prints
/// nothing of them.
pub struct SecretsKey {
    /// `KILN_SECRETS_KEY` itself: only opens values sealed before [`FORMAT_V2`].
    legacy: SecretBox<[u8; 32]>,
    sealing: SecretBox<[u8; 32]>,
    fingerprint: SecretBox<[u8; 32]>,
}

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
        let hkdf = hkdf::Hkdf::<sha2::Sha256>::new(None, key.as_slice());
        let derive = |info: &[u8]| {
            let mut out = Box::new([0u8; 32]);
            // 32 bytes is far below HKDF-SHA256's limit (255 × 32).
            hkdf.expand(info, out.as_mut_slice()).map_err(|_| SecretsError::BadKey)?;
            Ok::<_, SecretsError>(SecretBox::new(out))
        };
        Ok(SecretsKey {
            sealing: derive(SEALING_INFO)?,
            fingerprint: derive(FINGERPRINT_INFO)?,
            legacy: SecretBox::new(key),
        })
    }

    /// `values` as stored for `at`: [`FORMAT_V2`], nonce, then the
    /// ciphertext of their JSON.
    pub fn seal(&self, at: &Sealed<'_>, values: &BTreeMap<String, String>) -> Result<Vec<u8>, SecretsError> {
        let plain = Zeroizing::new(serde_json::to_vec(values).map_err(|_| SecretsError::Seal)?);
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = at.aad();
        let sealed = cipher(&self.sealing)
            .encrypt(&nonce, Payload { msg: &plain, aad: &aad })
            .map_err(|_| SecretsError::Seal)?;
        let mut out = Vec::with_capacity(1 + NONCE_BYTES + sealed.len());
        out.push(FORMAT_V2);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// What [`SecretsKey::seal`] sealed for `at`, or a value of the
    /// format before it sealed for the same owner (and server).
    pub fn open(&self, at: &Sealed<'_>, stored: &[u8]) -> Result<BTreeMap<String, String>, SecretsError> {
        // An old value starts with a random nonce, so its first byte is the
        // version byte once in 256: the current format is tried first, and
        // the old one whenever it fails.
        if let Some((&FORMAT_V2, rest)) = stored.split_first()
            && let Ok(values) = open_with(&self.sealing, &at.aad(), rest)
        {
            return Ok(values);
        }
        open_with(&self.legacy, &at.legacy_aad(), stored)
    }

    /// `stored` sealed again in the current format for `at` when it was
    /// sealed the old way (`None` when it is current already): what a
    /// write that keeps a value stores.
    pub fn reseal_if_old(&self, at: &Sealed<'_>, stored: &[u8]) -> Result<Option<Vec<u8>>, SecretsError> {
        if let Some((&FORMAT_V2, rest)) = stored.split_first()
            && open_with(&self.sealing, &at.aad(), rest).is_ok()
        {
            return Ok(None);
        }
        let values = open_with(&self.legacy, &at.legacy_aad(), stored)?;
        self.seal(at, &values).map(Some)
    }

    /// A keyed hash of one secret (HMAC-SHA256 under the fingerprint key,
    /// derived from the deployment's, never the sealing key): what the
    /// cache key holds, so a changed value misses without the value being
    /// recoverable from the key.
    pub fn fingerprint(&self, name: &str, value: &str) -> String {
        let mut mac = match hmac::Hmac::<sha2::Sha256>::new_from_slice(self.fingerprint.expose_secret()) {
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

fn cipher(key: &SecretBox<[u8; 32]>) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(key.expose_secret().into())
}

/// Opens `nonce ‖ ciphertext` under `key` and `aad`.
fn open_with(key: &SecretBox<[u8; 32]>, aad: &[u8], stored: &[u8]) -> Result<BTreeMap<String, String>, SecretsError> {
    if stored.len() < NONCE_BYTES {
        return Err(SecretsError::Open);
    }
    let (nonce, sealed) = stored.split_at(NONCE_BYTES);
    let plain =
        cipher(key).decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad }).map_err(|_| SecretsError::Open)?;
    let plain = Zeroizing::new(plain);
    serde_json::from_slice(&plain).map_err(|_| SecretsError::Open)
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;
