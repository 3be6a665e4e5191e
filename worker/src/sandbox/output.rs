//! Bounded capture of command output: keeps the head and the tail, counts
//! what was dropped in between, so memory stays bounded whatever a command
//! prints.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
}

impl HeadTail {
    /// Keeps at most `cap` bytes: half from the start, half from the end.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        HeadTail { head: Vec::new(), tail: VecDeque::new(), head_cap, tail_cap: cap - head_cap, dropped: 0 }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
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

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The kept output as text (invalid UTF-8 shown lossily), with a marker
    /// where bytes were cut.
    pub fn render(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let tail = String::from_utf8_lossy(&tail);
        if self.dropped == 0 {
            format!("{head}{tail}")
        } else {
            format!("{head}\n[... {} bytes of output omitted ...]\n{tail}", self.dropped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut h = HeadTail::new(100);
        h.push(b"hello ");
        h.push(b"world");
        assert_eq!(h.render(), "hello world");
        assert_eq!(h.dropped(), 0);
    }

    #[test]
    fn large_output_keeps_head_and_tail_and_counts_the_cut() {
        let mut h = HeadTail::new(10);
        for chunk in b"0123456789abcdefghijklmnopqrstuvwxyz".chunks(3) {
            h.push(chunk);
        }
        assert_eq!(h.dropped(), 26);
        assert_eq!(h.render(), "01234\n[... 26 bytes of output omitted ...]\nvwxyz");
    }

    #[test]
    fn one_huge_chunk_is_bounded() {
        let mut h = HeadTail::new(8);
        h.push(&vec![b'x'; 1_000_000]);
        assert_eq!(h.dropped(), 1_000_000 - 8);
        assert!(h.render().len() < 100);
    }
}
