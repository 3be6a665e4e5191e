//! The end of a script's output: what a failed setup's error quotes.

/// Bytes kept, and lines shown at most.
const KEEP_BYTES: usize = 4 * 1024;
const SHOW_LINES: usize = 30;

#[derive(Default)]
pub struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    pub fn new() -> Self {
        Tail::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * KEEP_BYTES {
            self.bytes.drain(..self.bytes.len() - KEEP_BYTES);
        }
    }

    /// The last lines (at most [`SHOW_LINES`], within [`KEEP_BYTES`]).
    pub fn render(&self) -> String {
        let start = self.bytes.len().saturating_sub(KEEP_BYTES);
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
}
