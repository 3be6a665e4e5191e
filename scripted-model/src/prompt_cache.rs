//! Anthropic's prompt cache, computed from the requests instead of written
//! in the script: what a Messages request reads from the cache and writes to
//! it, as Anthropic documents it.
//!
//! - The prompt is the tools, then the system prompt, then the messages,
//!   each cut into blocks (a tool, a system text block, a message's content
//!   block). A block with `cache_control` is a breakpoint: the prompt up to
//!   and including it is written to the cache.
//! - A request reads the longest prefix an earlier request wrote that ends at
//!   one of its breakpoints or at one of the [`LOOKBACK`] blocks before it
//!   (the API checks those boundaries too, so sliding breakpoints on the
//!   latest messages still find the previous step's prefix).
//! - What it writes beyond that is `cache_creation_input_tokens`; the rest
//!   of the prompt is `input_tokens`. A prefix shorter than
//!   [`MIN_CACHEABLE_TOKENS`] is not cached.
//!
//! Tokens are counted the same way for every request: a quarter of each
//! block's JSON (without its `cache_control`), rounded up. The cache does
//! not expire: a test's run is far shorter than the API's five minutes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

/// Block boundaries before a breakpoint the API also checks for a hit.
pub const LOOKBACK: usize = 20;
/// The shortest prefix the API caches (Claude Sonnet and Opus; Haiku's is
/// larger).
pub const MIN_CACHEABLE_TOKENS: u64 = 1024;

/// What one request reads, writes and pays in full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Input tokens neither read from nor written to the cache.
    pub input_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

/// The prefixes written so far: their hash and length in tokens.
#[derive(Debug, Default)]
pub struct PromptCache {
    written: HashMap<u64, u64>,
}

/// The prompt up to and including one block.
struct Prefix {
    hash: u64,
    tokens: u64,
    breakpoint: bool,
}

impl PromptCache {
    /// Reads and writes the cache for one Messages request body.
    pub fn account(&mut self, body: &Value) -> CacheUsage {
        let prefixes = prefixes(body);
        let total = prefixes.last().map_or(0, |p| p.tokens);
        let read = prefixes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.breakpoint)
            .filter_map(|(at, _)| {
                // The longest written prefix at or shortly before this breakpoint.
                let from = at.saturating_sub(LOOKBACK - 1);
                prefixes[from..=at].iter().rev().find_map(|p| self.written.get(&p.hash).copied())
            })
            .max()
            .unwrap_or(0);
        let mut written_to = read;
        for prefix in prefixes.iter().filter(|p| p.breakpoint && p.tokens >= MIN_CACHEABLE_TOKENS) {
            self.written.insert(prefix.hash, prefix.tokens);
            written_to = written_to.max(prefix.tokens);
        }
        let write = written_to - read;
        CacheUsage { input_tokens: total - read - write, cache_read_tokens: read, cache_write_tokens: write }
    }
}

/// Every block boundary of the prompt, in order: tools, system, messages.
fn prefixes(body: &Value) -> Vec<Prefix> {
    let mut blocks: Vec<(&str, &Value)> = Vec::new();
    for tool in body.get("tools").and_then(Value::as_array).into_iter().flatten() {
        blocks.push(("tool", tool));
    }
    match body.get("system") {
        Some(Value::Array(system)) => blocks.extend(system.iter().map(|b| ("system", b))),
        Some(text @ Value::String(_)) => blocks.push(("system", text)),
        _ => {}
    }
    for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("assistant") => "assistant",
            _ => "user",
        };
        match message.get("content") {
            Some(Value::Array(content)) => blocks.extend(content.iter().map(|b| (role, b))),
            Some(text) => blocks.push((role, text)),
            None => {}
        }
    }
    let mut hasher = DefaultHasher::new();
    let mut tokens = 0;
    blocks
        .into_iter()
        .map(|(kind, block)| {
            let breakpoint = block.get("cache_control").is_some();
            let text = without_cache_control(block).to_string();
            // A block's place (tools, system, which role) is part of the prefix.
            kind.hash(&mut hasher);
            text.hash(&mut hasher);
            tokens += (text.len() as u64).div_ceil(4);
            Prefix { hash: hasher.finish(), tokens, breakpoint }
        })
        .collect()
}

/// Where a breakpoint sits does not change what is cached.
fn without_cache_control(block: &Value) -> Value {
    let mut block = block.clone();
    if let Some(object) = block.as_object_mut() {
        object.remove("cache_control");
    }
    block
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    const MARK: &str = "ephemeral";

    fn text(text: &str, marked: bool) -> Value {
        let mut block = json!({"type": "text", "text": text});
        if marked {
            block["cache_control"] = json!({"type": MARK});
        }
        block
    }

    /// Tools and a system prompt of about 2,000 tokens, the conversation's
    /// messages, and breakpoints on the last tool, the system and the last
    /// two messages, as Kiln sends them.
    fn request(turns: &[&str]) -> Value {
        let tools = json!([
            {"name": "bash", "description": "x".repeat(3000), "input_schema": {"type": "object"}},
            {"name": "view", "description": "y".repeat(3000), "input_schema": {"type": "object"},
             "cache_control": {"type": MARK}},
        ]);
        let marked_from = turns.len().saturating_sub(2);
        let messages: Vec<Value> = turns
            .iter()
            .enumerate()
            .map(|(i, turn)| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": [text(turn, i >= marked_from)]})
            })
            .collect();
        json!({"model": "m", "tools": tools, "system": [text(&"s".repeat(4000), true)], "messages": messages})
    }

    fn total(body: &Value) -> u64 {
        prefixes(body).last().unwrap().tokens
    }

    #[test]
    fn the_first_request_writes_its_prefix_and_the_next_reads_it() {
        let mut cache = PromptCache::default();
        let turn = "t".repeat(400);
        let first = request(&[&turn]);
        let usage = cache.account(&first);
        assert_eq!(usage.cache_read_tokens, 0);
        assert_eq!(usage.input_tokens + usage.cache_write_tokens, total(&first));
        assert_eq!(usage.input_tokens, 0, "the last message is a breakpoint: everything is written");

        // Two more messages: the breakpoints moved past the old ones, and the
        // old prefix is found within the lookback.
        let second = request(&[&turn, &turn, &turn]);
        let usage = cache.account(&second);
        assert_eq!(usage.cache_read_tokens, total(&first));
        assert_eq!(usage.cache_write_tokens, total(&second) - total(&first));
        assert_eq!(usage.input_tokens, 0);
    }

    #[test]
    fn a_changed_block_ends_the_prefix_read_there() {
        let mut cache = PromptCache::default();
        let turn = "t".repeat(400);
        cache.account(&request(&[&turn, &turn, &turn]));
        let mut changed = request(&[&turn, &turn, &turn]);
        changed["system"][0]["text"] = json!("another system prompt ".repeat(300));
        let usage = cache.account(&changed);
        // Tools still match: the tools' breakpoint prefix is read.
        let tools_only = prefixes(&changed)[1].tokens;
        assert_eq!(usage.cache_read_tokens, tools_only);
        assert_eq!(usage.cache_write_tokens, total(&changed) - tools_only);
    }

    #[test]
    fn without_breakpoints_nothing_is_read_or_written() {
        let mut cache = PromptCache::default();
        let mut body = request(&["hello"]);
        let plain = |v: &mut Value| {
            for tool in v["tools"].as_array_mut().unwrap() {
                tool.as_object_mut().unwrap().remove("cache_control");
            }
            v["system"] = json!("s".repeat(4000));
            v["messages"][0]["content"] = json!("hello");
        };
        plain(&mut body);
        for _ in 0..2 {
            let usage = cache.account(&body);
            assert_eq!(usage, CacheUsage { input_tokens: total(&body), ..CacheUsage::default() });
        }
    }

    #[test]
    fn a_short_prefix_is_not_cached() {
        let mut cache = PromptCache::default();
        let body = json!({"system": [text("short", true)], "messages": [{"role": "user", "content": "hi"}]});
        for _ in 0..2 {
            assert_eq!(cache.account(&body).cache_read_tokens, 0);
        }
    }

    #[test]
    fn a_prefix_further_back_than_the_lookback_is_not_found() {
        let mut cache = PromptCache::default();
        let turn = "t".repeat(40);
        let first: Vec<&str> = vec![&turn; 1];
        cache.account(&request(&first));
        // 30 more messages: the old prefix lies more than 20 blocks before
        // the nearest breakpoint, except the system's, which still matches.
        let later: Vec<&str> = vec![&turn; 31];
        let body = request(&later);
        let usage = cache.account(&body);
        assert_eq!(usage.cache_read_tokens, prefixes(&body)[2].tokens, "only tools and system are read");
    }
}
