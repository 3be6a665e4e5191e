//! Reads what bash's `export -p` prints: the exported variables and their
//! values, quoted so bash could read them back.
//!
//! The EXIT trap records the session's environment this way because it is
//! one builtin writing into one file; listing the names first and printing
//! each value took three opens of the state file, and opening a file is a
//! tenth of a millisecond or more inside a sandbox.
//!
//! bash 5 prints each variable on its own line as `declare -FLAGS NAME`
//! (exported, no value: not in the environment), `declare -FLAGS
//! NAME="..."` (`"`, `\`, `$` and `` ` `` escaped with a backslash; other
//! characters, newlines included, as they are) or `declare -FLAGS NAME=$'...'`
//! (ANSI-C quoting, used when the value holds control characters). In POSIX
//! mode the lines start `export NAME` instead. Arrays (`NAME=(...)`) are
//! never passed to programs, so they are skipped.
//!
//! A POSIX `sh` (busybox, dash: the shell of an image without bash) prints
//! `export NAME='...'`, a single quote inside the value written as
//! `'"'"'` or `'\''`: quoted pieces one after the other.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// The variables `text` exports with a value, in order.
pub(super) fn parse(text: &[u8]) -> Vec<(OsString, OsString)> {
    let mut out = Vec::new();
    let mut p = Parser { text, pos: 0 };
    while p.pos < text.len() {
        match p.entry() {
            Some(Some((name, value))) => out.push((OsString::from_vec(name), OsString::from_vec(value))),
            Some(None) => {}
            // Not a line we understand: skip it rather than guess.
            None => p.skip_line(),
        }
    }
    out
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn eat(&mut self, prefix: &[u8]) -> bool {
        if self.text[self.pos..].starts_with(prefix) {
            self.pos += prefix.len();
            true
        } else {
            false
        }
    }

    fn skip_line(&mut self) {
        match self.text[self.pos..].iter().position(|&b| b == b'\n') {
            Some(n) => self.pos += n + 1,
            None => self.pos = self.text.len(),
        }
    }

    /// One line: `Some(Some(var))`, `Some(None)` for a line that exports
    /// nothing to programs, `None` for a line not in the expected form.
    fn entry(&mut self) -> Option<Option<(Vec<u8>, Vec<u8>)>> {
        if self.eat(b"declare -") {
            while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
                self.pos += 1;
            }
            if !self.eat(b" ") {
                return None;
            }
        } else if !self.eat(b"export ") {
            return None;
        }
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            self.pos += 1;
        }
        let name = self.text[start..self.pos].to_vec();
        if name.is_empty() {
            return None;
        }
        match self.peek() {
            None => Some(None),
            Some(b'\n') => {
                self.pos += 1;
                Some(None)
            }
            Some(b'=') => {
                self.pos += 1;
                let value = match self.peek()? {
                    b'"' => {
                        self.pos += 1;
                        Some(self.double_quoted()?)
                    }
                    b'$' if self.eat(b"$'") => Some(self.ansi_c()?),
                    b'\'' => Some(self.posix_quoted()?),
                    b'(' => {
                        self.array()?;
                        None
                    }
                    _ => return None,
                };
                match self.peek() {
                    None => {}
                    Some(b'\n') => self.pos += 1,
                    Some(_) => return None,
                }
                Some(value.map(|v| (name, v)))
            }
            Some(_) => None,
        }
    }

    /// After the opening `"`: up to and past the closing one.
    fn double_quoted(&mut self) -> Option<Vec<u8>> {
        let mut value = Vec::new();
        loop {
            let b = self.peek()?;
            self.pos += 1;
            match b {
                b'"' => return Some(value),
                b'\\' => match self.peek()? {
                    c @ (b'"' | b'\\' | b'$' | b'`') => {
                        value.push(c);
                        self.pos += 1;
                    }
                    // Only those four are escaped; a backslash before
                    // anything else is itself.
                    _ => value.push(b'\\'),
                },
                _ => value.push(b),
            }
        }
    }

    /// Single-quoted pieces, and the `"'"` or `\'` between them, up to the
    /// end of the line.
    fn posix_quoted(&mut self) -> Option<Vec<u8>> {
        let mut value = Vec::new();
        loop {
            match self.peek() {
                Some(b'\'') => {
                    self.pos += 1;
                    let len = self.text[self.pos..].iter().position(|&b| b == b'\'')?;
                    value.extend_from_slice(&self.text[self.pos..self.pos + len]);
                    self.pos += len + 1;
                }
                Some(b'"') => {
                    self.pos += 1;
                    value.extend(self.double_quoted()?);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    value.push(self.peek()?);
                    self.pos += 1;
                }
                _ => return Some(value),
            }
        }
    }

    /// After the opening `$'`: up to and past the closing `'`.
    fn ansi_c(&mut self) -> Option<Vec<u8>> {
        let mut value = Vec::new();
        loop {
            let b = self.peek()?;
            self.pos += 1;
            if b == b'\'' {
                return Some(value);
            }
            if b != b'\\' {
                value.push(b);
                continue;
            }
            let e = self.peek()?;
            self.pos += 1;
            match e {
                b'a' => value.push(0x07),
                b'b' => value.push(0x08),
                b'e' | b'E' => value.push(0x1b),
                b'f' => value.push(0x0c),
                b'n' => value.push(b'\n'),
                b'r' => value.push(b'\r'),
                b't' => value.push(b'\t'),
                b'v' => value.push(0x0b),
                b'\\' | b'\'' | b'"' | b'?' => value.push(e),
                b'0'..=b'7' => {
                    let mut n = u32::from(e - b'0');
                    for _ in 0..2 {
                        match self.peek() {
                            Some(d @ b'0'..=b'7') => {
                                n = n * 8 + u32::from(d - b'0');
                                self.pos += 1;
                            }
                            _ => break,
                        }
                    }
                    value.push((n & 0xff) as u8);
                }
                b'x' => {
                    let n = self.hex(2)?;
                    value.push((n & 0xff) as u8);
                }
                b'u' | b'U' => {
                    let n = self.hex(if e == b'u' { 4 } else { 8 })?;
                    let c = char::from_u32(n)?;
                    let mut buf = [0u8; 4];
                    value.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b'c' => {
                    let c = self.peek()?;
                    self.pos += 1;
                    value.push(c & 0x1f);
                }
                _ => {
                    value.push(b'\\');
                    value.push(e);
                }
            }
        }
    }

    /// Up to `digits` hex digits (at least one).
    fn hex(&mut self, digits: usize) -> Option<u32> {
        let mut n = 0u32;
        let mut seen = 0;
        while seen < digits {
            let Some(d) = self.peek().and_then(|b| (b as char).to_digit(16)) else { break };
            n = n * 16 + d;
            self.pos += 1;
            seen += 1;
        }
        (seen > 0).then_some(n)
    }

    /// Skips `([0]="a" [1]=$'b')`.
    fn array(&mut self) -> Option<()> {
        self.pos += 1;
        loop {
            match self.peek()? {
                b')' => {
                    self.pos += 1;
                    return Some(());
                }
                b'"' => {
                    self.pos += 1;
                    self.double_quoted()?;
                }
                b'$' if self.eat(b"$'") => {
                    self.ansi_c()?;
                }
                _ => self.pos += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(text: &str) -> Vec<(String, String)> {
        parse(text.as_bytes())
            .into_iter()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
            .collect()
    }

    #[test]
    fn reads_every_quoting_bash_uses() {
        let text = "declare -x A=$'a\\nb\\tc\\001d\\E[0m\\'q'\n\
                    declare -x B=\"q\\\"u\\$o\\`t\\\\e \\n kept\nsecond line\"\n\
                    declare -x C=\"\"\n\
                    declare -x D\n\
                    declare -ix E=\"5\"\n\
                    declare -ax F=([0]=\"x)\" [1]=$'y\\'')\n\
                    export G=\"posix mode\"\n";
        assert_eq!(
            vars(text),
            vec![
                ("A".into(), "a\nb\tc\u{1}d\u{1b}[0m'q".into()),
                ("B".into(), "q\"u$o`t\\e \\n kept\nsecond line".into()),
                ("C".into(), String::new()),
                ("E".into(), "5".into()),
                ("G".into(), "posix mode".into()),
            ]
        );
    }

    #[test]
    fn reads_what_a_posix_sh_prints() {
        // busybox ash and dash: single quotes, a quote inside as '"'"' or '\''.
        let text = "export A='it'\"'\"'s\nsecond'\nexport B=''\nexport C='a$b\"c'\nexport D\nexport E='x'\\''y'\n";
        assert_eq!(
            vars(text),
            vec![
                ("A".into(), "it's\nsecond".into()),
                ("B".into(), String::new()),
                ("C".into(), "a$b\"c".into()),
                ("E".into(), "x'y".into()),
            ]
        );
    }

    #[test]
    fn octal_escapes_give_back_bytes_that_are_not_utf8() {
        let parsed = parse(b"declare -x X=$'\\377\\1a'\n");
        assert_eq!(parsed, vec![(OsString::from("X"), OsString::from_vec(vec![0xff, 1, b'a']))]);
    }

    #[test]
    fn a_line_it_does_not_understand_is_skipped_not_guessed() {
        assert_eq!(
            vars("garbage line\ndeclare -x OK=\"1\"\ndeclare -x BAD=unquoted\ndeclare -x Z=\"2\"\n"),
            vec![("OK".into(), "1".into()), ("Z".into(), "2".into())]
        );
    }
}
