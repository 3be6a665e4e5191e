//! The names the model calls MCP tools by: `mcp__<server>__<tool>`, with
//! every character outside `[A-Za-z0-9_-]` made `_` and at most 64
//! characters — what the providers accept (Anthropic and OpenAI both refuse
//! longer names or other characters, and a single bad name fails the whole
//! request). A name that had to be cut, or that collides with one already
//! given, ends in `_` and 8 hex digits of the SHA-256 of the server and
//! tool names as the server gave them, so it stays unique and stable.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

/// Longest name the providers accept.
pub const MAX_NAME_CHARS: usize = 64;
/// What every MCP tool's name starts with.
pub const PREFIX: &str = "mcp__";
/// Hex digits of the hash suffix.
const HASH_CHARS: usize = 8;

/// Gives MCP tools names, unique within one run.
#[derive(Debug, Default)]
pub struct Namer {
    taken: BTreeSet<String>,
}

impl Namer {
    /// A namer that never hands out `reserved` (the built-in tools' names).
    pub fn reserving<'a>(reserved: impl IntoIterator<Item = &'a str>) -> Self {
        Namer { taken: reserved.into_iter().map(str::to_owned).collect() }
    }

    /// The model-facing name of `tool` of `server`.
    pub fn name(&mut self, server: &str, tool: &str) -> String {
        let plain = sanitise(&format!("{PREFIX}{server}__{tool}"));
        let name = if plain.len() <= MAX_NAME_CHARS && !self.taken.contains(&plain) {
            plain
        } else {
            let hash = hex::encode(Sha256::digest(format!("{server}\0{tool}").as_bytes()));
            // ASCII only after sanitising: any byte index is a char boundary.
            let keep = MAX_NAME_CHARS - 1 - HASH_CHARS;
            format!("{}_{}", &plain[..plain.len().min(keep)], &hash[..HASH_CHARS])
        };
        self.taken.insert(name.clone());
        name
    }
}

/// `name` with every character outside `[A-Za-z0-9_-]` made `_`.
fn sanitise(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        name.len() <= MAX_NAME_CHARS && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn short_names_are_prefixed_and_sanitised() {
        let mut n = Namer::default();
        assert_eq!(n.name("demo", "add"), "mcp__demo__add");
        assert_eq!(n.name("demo", "read.file/ü"), "mcp__demo__read_file__");
    }

    #[test]
    fn long_names_are_cut_with_a_stable_hash() {
        let server = "s".repeat(40);
        let tool = "t".repeat(40);
        let a = Namer::default().name(&server, &tool);
        assert!(valid(&a), "{a}");
        assert_eq!(a.len(), MAX_NAME_CHARS);
        assert!(a.starts_with("mcp__ssss"));
        assert_eq!(a, Namer::default().name(&server, &tool), "the same pair gets the same name");
        let b = Namer::default().name(&server, &format!("{tool}x"));
        assert_ne!(a, b, "pairs that share the cut prefix still differ");
        // Exactly 64 is kept whole.
        let fits = "t".repeat(MAX_NAME_CHARS - "mcp__ab__".len());
        assert_eq!(Namer::default().name("ab", &fits), format!("mcp__ab__{fits}"));
    }

    #[test]
    fn collisions_after_sanitising_get_distinct_names() {
        let mut n = Namer::reserving(["mcp__x__taken"]);
        let a = n.name("demo", "a.b");
        let b = n.name("demo", "a/b");
        assert_eq!(a, "mcp__demo__a_b");
        assert_ne!(a, b);
        assert!(valid(&b) && b.starts_with("mcp__demo__a_b_"), "{b}");
        assert_ne!(n.name("x", "taken"), "mcp__x__taken");
    }
}
