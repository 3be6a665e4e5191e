//! What valid input is, said once.
//!
//! Each rule here is used twice: by the check that refuses a request, and by
//! the OpenAPI document, which states it as JSON Schema keywords
//! ([`Constraint::keywords`]; `api/src/openapi/constraints.rs` puts them on
//! the fields and parameters). So a client generated from the document
//! never sends what the server refuses, and the server never accepts what
//! the document calls invalid.
//!
//! Patterns are written in the part of the regex language where ECMA-262
//! (JSON Schema's dialect), Python's `re` (schemathesis, many generators)
//! and Rust's `regex` (the server) agree: anchored with `^…$`, explicit
//! character classes with `\uHHHH` escapes and no shorthand classes (`\s`,
//! `\d` and `\w` differ between them), no lookaround. Lengths are in
//! characters (what `minLength`/`maxLength` count), never a quantifier over
//! non-ASCII text (ECMA-262 counts UTF-16 units).

use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Map, Value, json};

/// Unicode `White_Space`: what `char::is_whitespace` and `str::trim` treat
/// as blank (a test checks every character against it).
macro_rules! white_space {
    () => {
        r"\u0009-\u000D\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000"
    };
}

/// Unicode `Cc`: what `char::is_control` is (checked by the same test).
macro_rules! control {
    () => {
        r"\u0000-\u001F\u007F-\u009F"
    };
}

/// Something the document can state about a value: its JSON Schema keywords.
pub trait Constraint: Sync {
    fn keywords(&self) -> Map<String, Value>;
}

/// A regular expression in the common dialect described above, compiled
/// once on first use.
pub struct Pattern {
    source: &'static str,
    compiled: OnceLock<Option<Regex>>,
}

impl Pattern {
    pub const fn new(source: &'static str) -> Pattern {
        Pattern { source, compiled: OnceLock::new() }
    }

    pub fn source(&self) -> &'static str {
        self.source
    }

    /// A pattern that does not compile matches nothing (every rule's pattern
    /// is compiled by a test, so that only happens in a broken build).
    pub fn is_match(&self, s: &str) -> bool {
        self.compiled.get_or_init(|| Regex::new(self.source).ok()).as_ref().is_some_and(|r| r.is_match(s))
    }
}

/// A string: its length in characters and a pattern it must match.
pub struct Text {
    pub min_chars: usize,
    pub max_chars: usize,
    pub pattern: Pattern,
}

impl Text {
    pub const fn new(min_chars: usize, max_chars: usize, pattern: &'static str) -> Text {
        Text { min_chars, max_chars, pattern: Pattern::new(pattern) }
    }

    pub fn accepts(&self, s: &str) -> bool {
        let chars = s.chars().count();
        (self.min_chars..=self.max_chars).contains(&chars) && self.pattern.is_match(s)
    }
}

impl Constraint for Text {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = Map::new();
        if self.min_chars > 0 {
            k.insert("minLength".into(), json!(self.min_chars));
        }
        k.insert("maxLength".into(), json!(self.max_chars));
        k.insert("pattern".into(), json!(self.pattern.source));
        k
    }
}

/// A string a [`Text`] accepts and none of `except` matches: for a
/// grammar the common dialect can state only with lookaround (an image
/// name that is not an id). The document says it as the text's keywords
/// and `not: {anyOf: [{type: string, pattern}…]}` (the `type` so that
/// the `not` refuses only strings: a pattern says nothing of a `null`).
pub struct TextExcept<const N: usize> {
    pub text: Text,
    pub except: [Pattern; N],
}

impl<const N: usize> TextExcept<N> {
    pub fn accepts(&self, s: &str) -> bool {
        self.text.accepts(s) && !self.except.iter().any(|p| p.is_match(s))
    }
}

impl<const N: usize> Constraint for TextExcept<N> {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = self.text.keywords();
        let any: Vec<Value> = self.except.iter().map(|p| json!({ "type": "string", "pattern": p.source })).collect();
        k.insert("not".into(), json!({ "anyOf": any }));
        k
    }
}

/// A number between `min` and `max`, both included unless `min_exclusive`.
pub struct Range<T> {
    pub min: T,
    pub max: T,
    pub min_exclusive: bool,
}

impl<T: PartialOrd + Copy> Range<T> {
    pub const fn new(min: T, max: T) -> Range<T> {
        Range { min, max, min_exclusive: false }
    }

    /// More than `min` (a NaN is never in a range).
    pub const fn above(min: T, max: T) -> Range<T> {
        Range { min, max, min_exclusive: true }
    }

    pub fn contains(&self, v: T) -> bool {
        let low = if self.min_exclusive { v > self.min } else { v >= self.min };
        low && v <= self.max
    }
}

impl<T: serde::Serialize + Sync> Constraint for Range<T> {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = Map::new();
        let min = if self.min_exclusive { "exclusiveMinimum" } else { "minimum" };
        k.insert(min.into(), json!(self.min));
        k.insert("maximum".into(), json!(self.max));
        k
    }
}

/// One of a fixed set of strings.
pub struct OneOf(pub &'static [&'static str]);

impl OneOf {
    pub fn contains(&self, s: &str) -> bool {
        self.0.contains(&s)
    }
}

impl Constraint for OneOf {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = Map::new();
        k.insert("enum".into(), json!(self.0));
        k
    }
}

/// A list of at most `max_items` (its items have rules of their own).
pub struct List {
    pub max_items: usize,
}

impl List {
    /// True when `items` are few enough and each one passes `item`.
    pub fn accepts(&self, items: &[String], item: &Text) -> bool {
        items.len() <= self.max_items && items.iter().all(|i| item.accepts(i))
    }
}

impl Constraint for List {
    fn keywords(&self) -> Map<String, Value> {
        let mut k = Map::new();
        k.insert("maxItems".into(), json!(self.max_items));
        k
    }
}

/// Some text that is not blank (a character other than white space) and
/// has no NUL (Postgres text cannot hold it).
pub const NOT_BLANK_NO_NUL: &str = concat!("^[", white_space!(), "]*[^", r"\u0000", white_space!(), r"][^\u0000]*$");
/// Any text without NUL.
pub const NO_NUL: &str = r"^[^\u0000]*$";
/// Text without control characters (it reaches logs, metrics labels or a
/// URL path).
pub const NO_CONTROL: &str = concat!("^[^", control!(), "]*$");
/// Printable ASCII without space, as in an HTTP header token.
pub const PRINTABLE_ASCII: &str = r"^[!-~]*$";

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
