//! Server text made safe to print to a person's terminal. Everything a run
//! says comes from a model or from commands it ran: either can emit terminal
//! escapes (clipboard writes through OSC 52, a cleared screen, a carriage
//! return that overwrites a line with a forged one). Before the client prints
//! any of it, control characters other than newline and tab go, together
//! with the escape sequences they start.
//!
//! Each string is cleaned on its own, with no state carried between them: a
//! sequence split across two streamed pieces loses its introducer in the
//! first, so what is left in the second is inert text.

use serde_json::Value;

use crate::client::StreamedEvent;

const ESC: char = '\u{1b}';
const BEL: char = '\u{7}';
/// The 8-bit string terminator; the 7-bit one is `ESC \`.
const ST: char = '\u{9c}';

/// `s` without control characters (C0 but newline and tab, DEL, C1) and
/// without the escape sequences they introduce.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            ESC => match chars.peek().copied() {
                Some('[') => {
                    chars.next();
                    skip_csi(&mut chars);
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    skip_string(&mut chars);
                }
                // `ESC`, intermediates, a final character (`ESC c`, `ESC ( B`);
                // anything else after a lone `ESC` is text.
                Some(' '..='~') => skip_escape(&mut chars),
                _ => {}
            },
            '\u{9b}' => skip_csi(&mut chars),
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A control sequence's parameters and intermediates, then its final character.
fn skip_csi(chars: &mut impl Iterator<Item = char>) {
    for c in chars {
        if ('\u{40}'..='\u{7e}').contains(&c) || c.is_control() {
            return;
        }
    }
}

/// An escape's intermediates (space to `/`), then its final character.
fn skip_escape(chars: &mut impl Iterator<Item = char>) {
    for c in chars {
        if !(' '..='/').contains(&c) {
            return;
        }
    }
}

/// An OSC, DCS, SOS, PM or APC string, up to its terminator (BEL, `ESC \`
/// or ST) or the end of the text.
fn skip_string(chars: &mut std::iter::Peekable<impl Iterator<Item = char>>) {
    while let Some(c) = chars.next() {
        match c {
            BEL | ST => return,
            ESC => {
                chars.next_if_eq(&'\\');
                return;
            }
            _ => {}
        }
    }
}

/// `value` with every string in it (object keys too) made [`printable`].
pub fn printable_json(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(printable(s)),
        Value::Array(items) => Value::Array(items.iter().map(printable_json).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (printable(k), printable_json(v))).collect()),
        other => other.clone(),
    }
}

/// The event with every string of its payload made [`printable`]: what the
/// displays for a person see.
pub fn printable_event(event: &StreamedEvent) -> StreamedEvent {
    StreamedEvent { seq: event.seq, kind: printable(&event.kind), payload: printable_json(&event.payload) }
}

/// A serialized JSON text with the control characters JSON leaves raw
/// (DEL and C1, which it need not escape) written as `\u` escapes. Outside
/// strings JSON is ASCII without controls, so only string contents change,
/// and they decode to the same value.
pub fn escape_raw_controls(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_and_controls_go_and_the_text_around_them_stays() {
        let s = "a\u{1b}]52;c;aGVsbG8=\u{7}b\u{1b}[2Jc\u{9b}31md\re\u{1b}]0;title\u{1b}\\f\u{9d}8;;x\u{9c}g\u{1b}(Bh\u{1b}7i\u{7f}j";
        assert_eq!(printable(s), "abcdefghij");
        assert_eq!(printable("line one\n\tindented\r\n"), "line one\n\tindented\n");
        assert_eq!(printable("unterminated \u{1b}]52;c;abc"), "unterminated ");
        assert_eq!(printable("trailing \u{1b}"), "trailing ");
        assert_eq!(printable("naïve 😀 text"), "naïve 😀 text");
    }

    #[test]
    fn every_string_of_a_payload_is_cleaned() {
        let payload = json!({"items": [{"text": "x\u{1b}[2Jy", "n": 1}], "k\u{7}": true});
        assert_eq!(printable_json(&payload), json!({"items": [{"text": "xy", "n": 1}], "k": true}));
    }

    #[test]
    fn json_text_keeps_its_value_with_no_raw_controls() {
        let value = json!({"text": "a\u{9b}2J\u{7f}b\u{1b}"});
        let text = escape_raw_controls(&serde_json::to_string(&value).unwrap());
        assert!(!text.chars().any(char::is_control), "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
    }
}
