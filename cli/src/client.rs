//! A client of a running Kiln: submit a run, follow its events.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_protocol::event::is_terminal_kind;
use kiln_protocol::{CreateRun, Run};
use serde_json::Value;
use uuid::Uuid;

pub struct KilnClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl KilnClient {
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        Ok(KilnClient { base: base.trim_end_matches('/').to_owned(), token: token.to_owned(), http })
    }

    pub async fn create_run(&self, spec: &CreateRun) -> anyhow::Result<Run> {
        let response = self
            .http
            .post(format!("{}/v1/runs", self.base))
            .bearer_auth(&self.token)
            .json(spec)
            .send()
            .await
            .with_context(|| format!("connecting to Kiln at {}", self.base))?;
        parse(response).await
    }

    pub async fn get_run(&self, id: Uuid) -> anyhow::Result<Run> {
        let response = self.http.get(format!("{}/v1/runs/{id}", self.base)).bearer_auth(&self.token).send().await?;
        parse(response).await
    }

    /// Follows the run's events until its terminal event, reconnecting with
    /// `Last-Event-ID` when the connection drops. `on_event` sees each
    /// `(seq, kind, payload)` exactly once.
    pub async fn follow(&self, id: Uuid, mut on_event: impl FnMut(i64, &str, &Value)) -> anyhow::Result<String> {
        let mut last_seq = 0i64;
        let mut failures = 0u32;
        loop {
            let response = self
                .http
                .get(format!("{}/v1/runs/{id}/events", self.base))
                .bearer_auth(&self.token)
                .header("accept", "text/event-stream")
                .header("last-event-id", last_seq.to_string())
                .send()
                .await;
            let response = match response {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    bail!("following run {id} failed: HTTP {status}: {body}");
                }
                Err(e) => {
                    failures += 1;
                    if failures > 10 {
                        return Err(e).context("following the run's events");
                    }
                    tokio::time::sleep(Duration::from_millis(500 * u64::from(failures))).await;
                    continue;
                }
            };
            let mut stream = response.bytes_stream().eventsource();
            while let Some(item) = stream.next().await {
                let Ok(event) = item else { break };
                let Ok(seq) = event.id.parse::<i64>() else { continue };
                if seq <= last_seq {
                    continue;
                }
                last_seq = seq;
                failures = 0;
                let payload: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
                on_event(seq, &event.event, &payload);
                if is_terminal_kind(&event.event) {
                    return Ok(event.event);
                }
            }
            // The stream ended without a terminal event: reconnect and resume.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn parse<T: serde::de::DeserializeOwned>(response: reqwest::Response) -> anyhow::Result<T> {
    let status = response.status();
    let body = response.text().await?;
    if !status.is_success() {
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(body);
        bail!("Kiln answered HTTP {status}: {message}");
    }
    serde_json::from_str(&body).with_context(|| format!("unexpected answer from Kiln: {body}"))
}

/// Prints events for a person: streamed text inline, one line per tool call
/// and result, the ending in words.
pub struct Printer<W: Write> {
    out: W,
    /// Whether the cursor sits after streamed text (needs a newline first).
    mid_line: bool,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W) -> Self {
        Printer { out, mid_line: false }
    }

    pub fn print(&mut self, kind: &str, payload: &Value) {
        let line = match kind {
            "text.delta" => {
                let text = payload["text"].as_str().unwrap_or_default();
                let _ = write!(self.out, "{text}");
                let _ = self.out.flush();
                self.mid_line = !text.ends_with('\n');
                return;
            }
            "run.queued" => "● queued".to_owned(),
            "run.started" => format!("● started (attempt {})", payload["attempt"]),
            "sandbox.ready" => format!("● sandbox ready ({})", payload["image"].as_str().unwrap_or_default()),
            "tool_call.ready" => format!(
                "→ {} {}",
                payload["name"].as_str().unwrap_or_default(),
                one_line(&payload["arguments"].to_string(), 120)
            ),
            "tool.result" => {
                let mark = if payload["is_error"].as_bool() == Some(true) { "✗" } else { "✓" };
                format!(
                    "  {mark} {} ({} ms): {}",
                    payload["name"].as_str().unwrap_or_default(),
                    payload["duration_ms"],
                    one_line(payload["output"].as_str().unwrap_or_default(), 160)
                )
            }
            "model.retry" => {
                format!("● model call failed, retrying: {}", payload["error"].as_str().unwrap_or_default())
            }
            "run.succeeded" => "● run succeeded".to_owned(),
            "run.failed" => format!("● run failed: {}", payload["error"].as_str().unwrap_or_default()),
            "run.cancelled" => format!("● run cancelled: {}", payload["reason"].as_str().unwrap_or_default()),
            "run.timed_out" => format!("● run timed out after {} s", payload["limit_s"]),
            _ => return,
        };
        if self.mid_line {
            let _ = writeln!(self.out);
            self.mid_line = false;
        }
        let _ = writeln!(self.out, "{line}");
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max { format!("{}…", flat.chars().take(max).collect::<String>()) } else { flat }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_renders_text_inline_and_tools_as_lines() {
        let mut buf = Vec::new();
        let mut p = Printer::new(&mut buf);
        p.print("text.delta", &serde_json::json!({"text": "hel"}));
        p.print("text.delta", &serde_json::json!({"text": "lo"}));
        p.print("tool_call.ready", &serde_json::json!({"name": "bash", "arguments": {"command": "ls"}}));
        p.print(
            "tool.result",
            &serde_json::json!({"name": "bash", "duration_ms": 5, "output": "a\nb", "is_error": false}),
        );
        p.print("run.succeeded", &serde_json::json!({"summary": "x"}));
        let out = String::from_utf8(buf).unwrap();
        assert_eq!(out, "hello\n→ bash {\"command\":\"ls\"}\n  ✓ bash (5 ms): a b\n● run succeeded\n");
    }
}
