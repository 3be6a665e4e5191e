//! Turning a command's raw output bytes into text a model can read, with
//! bounded memory whatever the command prints.
//!
//! [`Sanitizer`] decodes UTF-8 lossily and drops terminal escape sequences,
//! statefully, so a multi-byte character or an escape sequence split across
//! two pipe reads comes out right. [`HeadTail`] keeps the start and the end of
//! the text and counts what it dropped in between.

use std::collections::VecDeque;
use std::fmt::Write as _;

/// Longest escape string (OSC, DCS, …) we wait for a terminator of; past it
/// the sequence is abandoned so a stray ESC cannot swallow the output.
const MAX_ESCAPE_STRING: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    /// Just saw ESC.
    Start,
    /// ESC followed by an intermediate byte (`(`, `)`, `#`, …): one more char ends it.
    Intermediate,
    /// Control Sequence (`ESC [` …): ends at a final byte 0x40–0x7E.
    Csi,
    /// OSC / DCS / SOS / PM / APC: ends at BEL or ST (`ESC \`).
    Str,
    /// ESC inside a string sequence: `\` ends it.
    StrEscape,
}

/// Streaming cleaner for terminal output: keeps text, `\n` and `\t`; drops
/// ANSI escape sequences; turns `\r\n` and a lone `\r` into `\n`; shows other
/// control characters as `\xNN`; replaces invalid UTF-8 with U+FFFD.
#[derive(Debug)]
pub struct Sanitizer {
    /// Start of a UTF-8 sequence cut by the end of the last chunk (≤ 3 bytes).
    carry: Vec<u8>,
    esc: Esc,
    esc_len: usize,
    pending_cr: bool,
}

impl Default for Sanitizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Sanitizer {
    pub fn new() -> Self {
        Sanitizer { carry: Vec::new(), esc: Esc::None, esc_len: 0, pending_cr: false }
    }

    /// Cleans `bytes`, appending the text to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        let joined;
        let mut rest: &[u8] = if self.carry.is_empty() {
            bytes
        } else {
            let mut v = std::mem::take(&mut self.carry);
            v.extend_from_slice(bytes);
            joined = v;
            &joined
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.push_str(s, out);
                    return;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` guarantees this prefix is UTF-8.
                    self.push_str(std::str::from_utf8(valid).unwrap_or_default(), out);
                    match e.error_len() {
                        Some(n) => {
                            self.push_char('\u{FFFD}', out);
                            rest = &after[n..];
                        }
                        None => {
                            // An incomplete sequence at the end: wait for the rest.
                            self.carry = after.to_vec();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is held back at the end of the stream.
    pub fn finish(&mut self, out: &mut String) {
        if !self.carry.is_empty() {
            self.carry.clear();
            self.push_char('\u{FFFD}', out);
        }
        if self.pending_cr {
            self.pending_cr = false;
            out.push('\n');
        }
        self.esc = Esc::None;
    }

    fn push_str(&mut self, s: &str, out: &mut String) {
        // Fast path: plain text with no state pending goes through in one copy.
        if self.esc == Esc::None && !self.pending_cr && !s.chars().any(needs_care) {
            out.push_str(s);
            return;
        }
        for c in s.chars() {
            self.push_char(c, out);
        }
    }

    fn push_char(&mut self, c: char, out: &mut String) {
        if self.esc == Esc::None {
            self.push_plain(c, out);
        } else {
            self.push_in_escape(c, out);
        }
    }

    /// One character inside an escape sequence: it moves the sequence on,
    /// and is shown only when it turns out not to belong to one.
    #[inline]
    fn push_in_escape(&mut self, c: char, out: &mut String) {
        match self.esc {
            Esc::None => self.push_plain(c, out),
            Esc::Start => {
                self.esc = match c {
                    '[' => Esc::Csi,
                    ']' | 'P' | 'X' | '^' | '_' => Esc::Str,
                    '(' | ')' | '*' | '+' | '-' | '.' | '/' | '#' | '%' | ' ' => Esc::Intermediate,
                    _ => Esc::None,
                };
                self.esc_len = 0;
            }
            Esc::Intermediate => self.esc = Esc::None,
            Esc::Csi => {
                self.esc_len += 1;
                match c {
                    '\u{40}'..='\u{7e}' => self.esc = Esc::None,
                    '\u{20}'..='\u{3f}' if self.esc_len < 64 => {}
                    // Not a well-formed sequence: abandon it and show the char.
                    _ => {
                        self.esc = Esc::None;
                        self.push_char(c, out);
                    }
                }
            }
            Esc::Str => {
                self.esc_len += 1;
                match c {
                    '\u{7}' => self.esc = Esc::None,
                    '\u{1b}' => self.esc = Esc::StrEscape,
                    _ if self.esc_len > MAX_ESCAPE_STRING => self.esc = Esc::None,
                    _ => {}
                }
            }
            Esc::StrEscape => self.esc = if c == '\\' { Esc::None } else { Esc::Str },
        }
    }

    /// One character outside any escape sequence.
    #[inline]
    fn push_plain(&mut self, c: char, out: &mut String) {
        if self.pending_cr {
            self.pending_cr = false;
            out.push('\n');
            if c == '\n' {
                return;
            }
        }
        match c {
            '\n' | '\t' => out.push(c),
            '\r' => self.pending_cr = true,
            '\u{1b}' => self.esc = Esc::Start,
            // CSI as a single C1 character.
            '\u{9b}' => {
                self.esc = Esc::Csi;
                self.esc_len = 0;
            }
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

fn needs_care(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// Keeps at most `cap` bytes of text: the first half and the last half.
#[derive(Debug)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
    total: u64,
}

impl HeadTail {
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        HeadTail { head: Vec::new(), tail: VecDeque::new(), head_cap, tail_cap: cap - head_cap, dropped: 0, total: 0 }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + bytes.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.dropped += overflow as u64;
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept text and how many bytes were left out. The cut never splits
    /// a character: partial characters at its edges count as left out.
    pub fn render(&self) -> (String, u64) {
        let head = utf8_prefix(&self.head);
        let tail_bytes: Vec<u8> = self.tail.iter().copied().collect();
        let tail = if self.dropped == 0 { &tail_bytes[..] } else { utf8_suffix(&tail_bytes) };
        let trimmed = (self.head.len() - head.len() + tail_bytes.len() - tail.len()) as u64;
        let head = String::from_utf8_lossy(head);
        let tail = String::from_utf8_lossy(tail);
        if self.dropped == 0 {
            return (format!("{head}{tail}"), 0);
        }
        let omitted = self.dropped + trimmed;
        let sep = if head.ends_with('\n') || head.is_empty() { "" } else { "\n" };
        (format!("{head}{sep}[... {omitted} bytes omitted ...]\n{tail}"), omitted)
    }
}

/// The longest prefix that does not end inside a UTF-8 character.
fn utf8_prefix(b: &[u8]) -> &[u8] {
    match std::str::from_utf8(b) {
        Err(e) if e.error_len().is_none() => &b[..e.valid_up_to()],
        _ => b,
    }
}

/// `b` without the continuation bytes of a character cut at its start.
fn utf8_suffix(b: &[u8]) -> &[u8] {
    let skip = b.iter().take(3).take_while(|&&x| x & 0xC0 == 0x80).count();
    &b[skip..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(chunks: &[&[u8]]) -> String {
        let mut s = Sanitizer::new();
        let mut out = String::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    #[test]
    fn escape_sequences_are_stripped_even_when_split_across_chunks() {
        assert_eq!(clean(&[b"\x1b[1;31mred\x1b[0m plain"]), "red plain");
        assert_eq!(clean(&[b"a\x1b[", b"1;3", b"1mb"]), "ab");
        assert_eq!(clean(&[b"\x1b]0;title\x07x", b"\x1b]8;;http://e\x1b\\y"]), "xy");
        assert_eq!(clean(&[b"\x1b(Bz"]), "z");
    }

    #[test]
    fn carriage_returns_become_newlines_and_controls_are_escaped() {
        assert_eq!(clean(&[b"a\r\nb\r", b"\nc\rd\r"]), "a\nb\nc\nd\n");
        assert_eq!(clean(&[b"t\tb\x07\x00e"]), "t\tb\\x07\\x00e");
    }

    #[test]
    fn utf8_split_across_chunks_is_kept_and_invalid_bytes_are_replaced() {
        let e = "é".as_bytes();
        assert_eq!(clean(&[&e[..1], &e[1..]]), "é");
        assert_eq!(clean(&[b"caf\xe9!"]), "caf\u{FFFD}!");
        assert_eq!(clean(&[b"end\xc3"]), "end\u{FFFD}");
    }

    #[test]
    fn head_tail_keeps_both_ends_and_counts_the_cut() {
        let mut h = HeadTail::new(10);
        for chunk in b"0123456789abcdefghijklmnopqrstuvwxyz".chunks(3) {
            h.push(chunk);
        }
        assert_eq!(h.render(), ("01234\n[... 26 bytes omitted ...]\nvwxyz".into(), 26));
        assert_eq!(h.total(), 36);
        let mut small = HeadTail::new(100);
        small.push(b"hello");
        assert_eq!(small.render(), ("hello".into(), 0));
    }

    #[test]
    fn head_tail_never_splits_a_character() {
        let mut h = HeadTail::new(6);
        h.push("ééééééééé".as_bytes());
        let (text, omitted) = h.render();
        assert!(!text.contains('\u{FFFD}'), "{text}");
        assert_eq!(text, "é\n[... 14 bytes omitted ...]\né");
        assert_eq!(omitted, 14);
    }
}
