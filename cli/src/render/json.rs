//! `--json`: one JSON object per event, exactly as streamed (`seq`, `kind`,
//! `payload`), for scripts. Nothing else goes to stdout. JSON escapes C0
//! controls itself; DEL and C1 ones are escaped too, so the lines are safe
//! on a terminal and still decode to the same values.

use std::io::Write;

use super::printable::escape_raw_controls;
use super::{Render, Totals};
use crate::client::StreamedEvent;

pub struct JsonLines<W: Write> {
    out: W,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines { out }
    }
}

impl<W: Write> Render for JsonLines<W> {
    fn event(&mut self, event: &StreamedEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            // A closed pipe (`| head`) is the reader's choice, not an error to report.
            let _ = writeln!(self.out, "{}", escape_raw_controls(&line));
            let _ = self.out.flush();
        }
    }

    fn finish(&mut self, _totals: &Totals) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prints_the_event_as_streamed() {
        let mut buf = Vec::new();
        let mut out = JsonLines::new(&mut buf);
        out.event(&StreamedEvent { seq: 3, kind: "text.delta".into(), payload: json!({"text": "hi"}) });
        out.finish(&Totals::default());
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\"seq\":3,\"kind\":\"text.delta\",\"payload\":{\"text\":\"hi\"}}\n"
        );
    }
}
