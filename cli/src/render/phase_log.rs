//! An environment's setup and maintenance output as lines under their
//! phase: `environment.output` arrives in pieces cut anywhere, so whole
//! lines are printed as they complete and the rest when the phase ends.

use super::one_line;

/// Longest line printed; a longer one is cut with an ellipsis.
const MAX_LINE_CHARS: usize = 200;
/// Held back while waiting for a newline; past it the piece is printed as
/// a line of its own (output need not have newlines).
const MAX_PARTIAL_BYTES: usize = 4096;

#[derive(Debug, Default)]
pub struct PhaseLog {
    /// The phase whose lines are being printed, once its header is out.
    phase: Option<String>,
    /// Output since the last newline.
    partial: String,
}

impl PhaseLog {
    /// The lines `text` (output of `phase`) completes, with the phase's
    /// header first when this is its first output.
    pub fn output(&mut self, phase: &str, text: &str) -> Vec<String> {
        let mut lines = Vec::new();
        if self.phase.as_deref() != Some(phase) {
            lines.extend(self.finish());
            lines.push(format!("● {phase} output:"));
            self.phase = Some(phase.to_owned());
        }
        self.partial.push_str(text);
        while let Some(newline) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=newline).collect();
            lines.push(indented(&line));
        }
        if self.partial.len() > MAX_PARTIAL_BYTES {
            lines.push(indented(&std::mem::take(&mut self.partial)));
        }
        lines
    }

    /// The phase ended: what is left of its last line.
    pub fn finish(&mut self) -> Vec<String> {
        self.phase = None;
        let rest = std::mem::take(&mut self.partial);
        if rest.trim().is_empty() { Vec::new() } else { vec![indented(&rest)] }
    }
}

fn indented(line: &str) -> String {
    let line = line.trim_end_matches(['\n', '\r']);
    // Tabs and other whitespace inside the line stay readable on one line.
    let shown = if line.trim().is_empty() { String::new() } else { one_line(line, MAX_LINE_CHARS) };
    format!("  │ {shown}").trim_end().to_owned()
}

/// The line that ends a phase: its exit code and time, and whether setup's
/// result was kept for the next run.
pub fn finished_line(phase: &str, exit_code: i64, duration_ms: u64, stored: bool) -> String {
    let kept = if stored { "; prepared sandbox stored in the cache" } else { "" };
    format!("{phase} exited {exit_code} ({duration_ms} ms){kept}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_indented_lines_under_one_header_per_phase() {
        let mut log = PhaseLog::default();
        let mut lines = log.output("setup", "install");
        lines.extend(log.output("setup", "ing deps\ndone\npart"));
        lines.extend(log.finish());
        lines.extend(log.output("maintenance", "again\n"));
        assert_eq!(
            lines,
            ["● setup output:", "  │ installing deps", "  │ done", "  │ part", "● maintenance output:", "  │ again"]
        );
        assert_eq!(log.output("maintenance", &"x".repeat(5000)).len(), 1);
        assert!(log.finish().is_empty());
        assert_eq!(finished_line("setup", 0, 5, true), "setup exited 0 (5 ms); prepared sandbox stored in the cache");
    }
}
