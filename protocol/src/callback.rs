//! Completion callbacks: the `callback_url` a run may name, and what Kiln
//! POSTs to it when the run ends.
//!
//! The request body is [`CallbackBody`] as JSON; the headers below carry the
//! signature (HMAC-SHA256 of the raw body with the run owner's callback key,
//! [`subject_key`]), the delivery id (the same on every attempt of one
//! callback, so a receiver can drop repeats) and the time of sending.
//!
//! Each subject has a key of its own, derived from the deployment's
//! `KILN_CALLBACK_SECRET` and the subject, and handed to that subject by
//! `GET /v1/callback-key`: a tenant holding its key can verify its own
//! callbacks but cannot sign one for another tenant's runs (HMAC is a PRF:
//! one subject's key says nothing about another's, nor about the secret).

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::run::Run;

/// `sha256=<hex of HMAC-SHA256(owner's callback key, raw body)>`.
pub const SIGNATURE_HEADER: &str = "x-kiln-signature-256";
/// Which key signed: [`KEY_ID`], the derivation scheme of the owner's key.
pub const SIGNATURE_KEY_HEADER: &str = "x-kiln-signature-key";
/// The key scheme: HMAC-SHA256(`KILN_CALLBACK_SECRET`, `"kiln-callback-v1:" + subject`).
pub const KEY_ID: &str = "v1";
/// The label the key of a subject is derived under (versioned with [`KEY_ID`]).
const KEY_LABEL: &str = "kiln-callback-v1:";

/// The key `subject`'s callbacks are signed with: HMAC-SHA256 keyed by the
/// deployment's callback secret over `"kiln-callback-v1:" + subject`. The
/// label keeps it apart from any other use of the secret; the subject is
/// last, so no two subjects share an input.
pub fn subject_key(secret: &[u8], subject: &str) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).unwrap_or_else(|_| unreachable_key());
    mac.update(KEY_LABEL.as_bytes());
    mac.update(subject.as_bytes());
    mac.finalize().into_bytes().into()
}

/// HMAC takes keys of every length; this is never reached.
fn unreachable_key() -> Hmac<Sha256> {
    unreachable!("HMAC-SHA256 accepts keys of any length")
}

/// `sha256=<hex>` of `body` under `key`, the value of [`SIGNATURE_HEADER`].
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable_key());
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}
/// The callback's id; every retry of the same callback repeats it.
pub const DELIVERY_HEADER: &str = "x-kiln-delivery";
/// The event name, as in the body.
pub const EVENT_HEADER: &str = "x-kiln-event";
/// Unix seconds when this attempt was sent (also `sent_at` in the body,
/// where the signature covers it).
pub const TIMESTAMP_HEADER: &str = "x-kiln-timestamp";

/// What a callback carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackBody {
    /// The run's terminal event kind: `run.succeeded`, `run.failed`,
    /// `run.cancelled` or `run.timed_out`.
    pub event: String,
    /// Same as the delivery header.
    pub delivery_id: Uuid,
    /// When this attempt was sent.
    pub sent_at: DateTime<Utc>,
    /// The subject that owns the run: the key that signed this body is
    /// this subject's.
    pub owner: String,
    /// The run as `GET /v1/runs/{id}` shows it when it ended.
    pub run: Run,
}
