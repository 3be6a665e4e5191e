//! Text logs: a span field recorded again replaces its earlier value.
//!
//! `tracing-subscriber`'s text format appends a re-recorded field to the
//! span's fields, so a run span whose `step` follows the loop printed
//! `step=0 step=1 step=2` on every line. This formatter renders fields as
//! the default one does (ANSI styling included) and, when a span records a
//! field it already has, removes the earlier `name=value` first.

use std::fmt;

use tracing::field::Field;
use tracing::span;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

#[derive(Debug, Default)]
pub struct LatestFields(DefaultFields);

impl<'writer> FormatFields<'writer> for LatestFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        self.0.format_fields(writer, fields)
    }

    fn add_fields(&self, current: &'writer mut FormattedFields<Self>, fields: &span::Record<'_>) -> fmt::Result {
        let mut names = Vec::new();
        fields.record(&mut |field: &Field, _: &dyn fmt::Debug| names.push(field.name()));
        for name in names {
            remove_field(&mut current.fields, name);
        }
        if !current.fields.is_empty() {
            current.fields.push(' ');
        }
        self.0.format_fields(current.as_writer(), fields)
    }
}

/// Removes `name=value` from rendered fields `s` (fields are separated by
/// one space; names may be wrapped in ANSI styles). A value runs to the
/// next ` name=`: a value that itself contains such text is cut there, which
/// only a field recorded twice with such a value could meet.
fn remove_field(s: &mut String, name: &str) {
    let Some(start) = field_starts(s).find(|&at| visible_starts_with(&s[at..], name, true)) else { return };
    let end = field_starts(s).find(|&at| at > start).unwrap_or(s.len());
    let (cut_from, cut_to) = if end < s.len() {
        // Keep one separator: drop this field and the space after it.
        (start, end)
    } else {
        // The last field: drop it and the space before it.
        (start.saturating_sub(1), end)
    };
    s.replace_range(cut_from..cut_to, "");
}

/// Byte offsets where a field starts: the start of `s`, or just after a
/// space, where an identifier followed by `=` begins (ANSI styles skipped).
fn field_starts(s: &str) -> impl Iterator<Item = usize> + '_ {
    let after_spaces = s.match_indices(' ').map(|(at, _)| at + 1);
    std::iter::once(0).chain(after_spaces).filter(|&at| at < s.len() && starts_with_name(&s[at..]))
}

fn starts_with_name(s: &str) -> bool {
    let visible = visible(s);
    let name: String = visible.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.').collect();
    !name.is_empty() && visible[name.len()..].starts_with('=')
}

/// Whether `s`, ANSI escapes skipped, starts with `name=` (`with_equals`).
fn visible_starts_with(s: &str, name: &str, with_equals: bool) -> bool {
    let visible = visible(s);
    visible.starts_with(name) && (!with_equals || visible[name.len()..].starts_with('='))
}

/// `s` without ANSI escape sequences (`ESC [ … letter`), up to its first
/// space (a field's name and `=` never contain one).
fn visible(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            ' ' => break,
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(s: &str, name: &str) -> String {
        let mut s = s.to_owned();
        remove_field(&mut s, name);
        s
    }

    #[test]
    fn a_field_is_removed_with_one_separator() {
        assert_eq!(removed("run_id=1 step=0 attempt=2", "step"), "run_id=1 attempt=2");
        assert_eq!(removed("run_id=1 step=0", "step"), "run_id=1");
        assert_eq!(removed("step=0 run_id=1", "step"), "run_id=1");
        assert_eq!(removed("step=0", "step"), "");
    }

    #[test]
    fn only_the_whole_name_matches() {
        assert_eq!(removed("steps=3 step=1", "step"), "steps=3");
        assert_eq!(removed("run_id=1", "step"), "run_id=1");
    }

    #[test]
    fn values_with_spaces_and_ansi_names_are_handled() {
        assert_eq!(removed("error=no such file outcome=failed", "error"), "outcome=failed");
        let styled = "\u{1b}[3mrun_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m1 \u{1b}[3mstep\u{1b}[0m\u{1b}[2m=\u{1b}[0m0";
        assert_eq!(removed(styled, "step"), "\u{1b}[3mrun_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m1");
    }
}
