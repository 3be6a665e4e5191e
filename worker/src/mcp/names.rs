//! The names the model calls MCP tools by: `mcp__<server>__<tool>`, with
//! every character outside `[A-Za-z0-9_-]` made `_` and at most 64
//! characters — what the providers accept (Anthropic and OpenAI both refuse
//! longer names or other characters, and a single bad name fails the whole
//! request). A name that had to be cut, or that collides with one already
//! given, ends in `_` and 8 hex digits of the SHA-256 of the server and
//! tool names as the server gave them, so it stays unique and stable.
//!
//! The first `__` after `mcp__` is the separator and nothing else: server
//! names hold no `__` and no `_` at either end
//! ([`kiln_protocol::input::MCP_SERVER_NAME`]), and a cut that falls
//! before the separator drops the `_`s it ends with, so the hash suffix
//! never makes one. A name whose server was cut has no separator at all:
//! only a pattern without one (`mcp__*`) matches it, never one that names
//! a server (see [`server_and_tool`]).

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

/// Longest name the providers accept.
pub const MAX_NAME_CHARS: usize = 64;
/// What every MCP tool's name starts with.
pub const PREFIX: &str = "mcp__";
/// Between the server's name and the tool's.
pub const SEPARATOR: &str = "__";
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
        let plain = sanitise(&format!("{PREFIX}{server}{SEPARATOR}{tool}"));
        let name = if plain.len() <= MAX_NAME_CHARS && !self.taken.contains(&plain) {
            plain
        } else {
            let hash = hex::encode(Sha256::digest(format!("{server}\0{tool}").as_bytes()));
            // ASCII only after sanitising: any byte index is a char boundary.
            let keep = MAX_NAME_CHARS - 1 - HASH_CHARS;
            let mut head = &plain[..plain.len().min(keep)];
            // Cut before the separator was whole: no `_` may remain at the
            // end to make a `__` with the suffix's.
            if head.len() < PREFIX.len() + server.chars().count() + SEPARATOR.len() {
                head = head.trim_end_matches('_');
                if head.len() < PREFIX.len() {
                    head = PREFIX.trim_end_matches('_');
                }
            }
            format!("{head}_{}", &hash[..HASH_CHARS])
        };
        self.taken.insert(name.clone());
        name
    }
}

/// An MCP tool's name (or a pattern of them) split at the separator:
/// `mcp__<server>__<tool>` → `Some((server, Some(tool)))`; `mcp__<rest>`
/// without a separator → `Some((rest, None))`; anything else → `None`.
pub fn server_and_tool(name: &str) -> Option<(&str, Option<&str>)> {
    let rest = name.strip_prefix(PREFIX)?;
    Some(match rest.split_once(SEPARATOR) {
        Some((server, tool)) => (server, Some(tool)),
        None => (rest, None),
    })
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
    fn a_cut_never_makes_a_separator_that_names_another_server() {
        // The server's only `_` falls right at the cut: the suffix's `_`
        // must not join it into `mcp__<49 a's>__<hash>`, which would read
        // as a tool of the server named by the 49 a's.
        let server = format!("{}_{}", "a".repeat(49), "b".repeat(10));
        let name = Namer::default().name(&server, "tool");
        assert!(valid(&name), "{name}");
        assert_eq!(server_and_tool(&name).and_then(|(_, tool)| tool), None, "{name}");
        // A cut after the separator keeps the server whole.
        let name = Namer::default().name("github", &"t".repeat(80));
        assert_eq!(server_and_tool(&name).map(|(s, _)| s), Some("github"), "{name}");
        // Every whole name splits into the server it was made for.
        for server in ["my_server", "a-b", "x_y_z"] {
            let name = Namer::default().name(server, "__odd__tool_");
            assert_eq!(server_and_tool(&name), Some((server, Some("__odd__tool_"))), "{name}");
        }
        assert_eq!(server_and_tool("bash"), None);
        assert_eq!(server_and_tool("mcp__*"), Some(("*", None)));
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
