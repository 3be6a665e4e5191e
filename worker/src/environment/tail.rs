//! The end of a script's output: what a failed setup's error quotes.

/// Bytes kept, and lines shown at most.
const KEEP_BYTES: usize = 4 * 1024;
const SHOW_LINES: usize = 30;

#[derive(Default)]
pub struct Tail {
    bytes: Vec<u8>,
    /// Whether bytes were dropped from the front.
    cut: bool,
}

impl Tail {
    pub fn new() -> Self {
        Tail::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * KEEP_BYTES {
            self.bytes.drain(..self.bytes.len() - KEEP_BYTES);
            self.cut = true;
        }
    }

    /// The last lines (at most [`SHOW_LINES`], within [`KEEP_BYTES`]).
    pub fn render(&self) -> String {
        let mut start = self.bytes.len().saturating_sub(KEEP_BYTES);
        if start > 0 || self.cut {
            // The first line was cut: dropped, so that no part of a secret
            // cut through (too short to be masked) is shown.
            start += self.bytes[start..].iter().position(|b| *b == b'\n').map_or(0, |n| n + 1);
        }
        let text = String::from_utf8_lossy(&self.bytes[start..]);
        let lines: Vec<&str> = text.trim_end().lines().collect();
        lines[lines.len().saturating_sub(SHOW_LINES)..].join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines_of_a_long_output() {
        let mut tail = Tail::new();
        for i in 0..10_000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        let shown = tail.render();
        assert_eq!(shown.lines().count(), SHOW_LINES);
        assert!(shown.ends_with("line 9999"), "{shown}");
        assert!(tail.bytes.len() <= 2 * KEEP_BYTES);
    }

    #[test]
    fn a_line_cut_at_the_front_is_not_shown() {
        let mut tail = Tail::new();
        tail.push(&[b'x'; 3 * KEEP_BYTES]);
        tail.push(b"tail-of-secret\nlast line\n");
        assert_eq!(tail.render(), "last line");
    }
}
