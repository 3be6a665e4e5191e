//! What the worker vouches for between a session's captures, kept on the
//! worker's side (the sandbox can change nothing here): the SHA-256 of the
//! capture's own index and of its base index as the last capture left them.
//!
//! The capture checks a seed index it did not write itself for entries
//! marked assume-unchanged or skip-worktree (they would hide a change from
//! `git add -A`): one more git command reading the whole index. An index
//! the capture wrote has no such entry (its seeds were checked or were
//! themselves written so), and the script passes over the check only for a
//! seed whose whole content hashes to what the worker kept: an index the
//! agent edited between captures does not, whatever its trailer says (git
//! does not verify an index's trailing checksum when it reads one). No
//! vouch known (a worker that took the session over, or one restarted):
//! the check runs.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use kiln_toolbox::change_capture::is_sha256;
use uuid::Uuid;

/// Most sessions vouched for at once; past it the oldest knowledge is
/// dropped (their next capture runs the check).
const MAX_SESSIONS: usize = 10_000;

/// The SHA-256 (hex) of the capture's kept indexes; `None`: none vouched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vouch {
    /// `/tmp/kiln-capture/index`, the last capture's own index.
    pub index: Option<String>,
    /// `/tmp/kiln-capture/base`, its index of the base's stat data.
    pub base: Option<String>,
}

impl Vouch {
    /// As the script takes them: a hash, or `-` (also for anything that is
    /// not one: these go into a command line).
    pub(crate) fn args(&self) -> [&str; 2] {
        [arg(&self.index), arg(&self.base)]
    }

    /// From the script's header fields: a SHA-256 in hex, or `-`; anything
    /// else vouches for nothing.
    pub(crate) fn from_fields(index: &str, base: &str) -> Vouch {
        Vouch { index: sha256(index), base: sha256(base) }
    }
}

fn arg(hash: &Option<String>) -> &str {
    hash.as_deref().filter(|h| is_sha256(h)).unwrap_or("-")
}

fn sha256(field: &str) -> Option<String> {
    is_sha256(field).then(|| field.to_owned())
}

/// This worker's vouches, per session.
#[derive(Debug, Default)]
pub struct Vouches(Mutex<HashMap<Uuid, Vouch>>);

impl Vouches {
    pub fn get(&self, session: Uuid) -> Vouch {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(&session).cloned().unwrap_or_default()
    }

    pub fn set(&self, session: Uuid, vouch: Vouch) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_SESSIONS && !map.contains_key(&session) {
            map.clear();
        }
        map.insert(session, vouch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hashes_are_vouched_for() {
        let hash = "ab".repeat(32);
        let vouch = Vouch::from_fields(&hash, "-");
        assert_eq!(vouch, Vouch { index: Some(hash.clone()), base: None });
        assert_eq!(vouch.args(), [hash.as_str(), "-"]);
        assert_eq!(Vouch { index: Some("; rm -rf /".into()), base: None }.args(), ["-", "-"]);
        for field in ["AB".repeat(32), "ab".repeat(20), format!("{} ", "ab".repeat(32)), "$(x)".into()] {
            assert_eq!(Vouch::from_fields(&field, &field), Vouch::default(), "{field:?}");
        }
    }

    #[test]
    fn vouches_are_per_session() {
        let vouches = Vouches::default();
        let (one, two) = (Uuid::new_v4(), Uuid::new_v4());
        let vouch = Vouch { index: Some("a".repeat(64)), base: None };
        vouches.set(one, vouch.clone());
        assert_eq!(vouches.get(one), vouch);
        assert_eq!(vouches.get(two), Vouch::default());
    }
}
