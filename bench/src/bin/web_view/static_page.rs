//! The baseline: the same events as one static HTML page, rendered once
//! on the server and served as it is by a plain axum server on loopback.
//! It shows what the web view shows once a run has ended, with the same
//! text: a line per step and event note, the assistant's text joined into
//! one block per turn, each tool call with its arguments and its result,
//! the plan and the token totals; and it ends with the same
//! `#timeline .end.succeeded` element the web view's page ends with.

use std::fmt::Write as _;
use std::net::SocketAddr;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use kiln_cli::render::totals::thousands;
use serde_json::Value;

/// Serves `html` at `/` on a loopback port, `no-store` (each load transfers
/// the page, as each load of the web view reads the events again).
pub async fn serve(html: String) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let page: &'static str = html.leak();
    let app = Router::new().route(
        "/",
        get(move || async move {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], page)
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Where the page is while rendering: the open text block, the open tool
/// call, the totals.
#[derive(Default)]
struct Page {
    body: String,
    text_open: bool,
    call_open: bool,
    input: u64,
    cached: u64,
    output: u64,
    usd: f64,
    steps: u64,
}

/// The page for `events` (kind and payload, in seq order).
pub fn render(events: &[(String, Value)]) -> String {
    let mut page = Page::default();
    for (kind, payload) in events {
        page.event(kind, payload);
    }
    page.close_text();
    page.close_call();
    let totals = format!(
        "<dl class=\"totals\"><dt>Input tokens</dt><dd>{}</dd><dt>Cached input</dt><dd>{}</dd>\
         <dt>Output tokens</dt><dd>{}</dd><dt>Cost</dt><dd>${:.4}</dd><dt>Steps</dt><dd>{}</dd></dl>",
        thousands(page.input),
        thousands(page.cached),
        thousands(page.output),
        page.usd,
        page.steps
    );
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Run</title><style>\
         pre{{white-space:pre-wrap}} .ev-meta{{color:#666}} .tool{{border:1px solid #ccc;margin:4px 0}}\
         </style></head><body>{totals}<div id=\"timeline\">{}</div></body></html>",
        page.body
    )
}

impl Page {
    fn event(&mut self, kind: &str, p: &Value) {
        if kind == "text.delta" {
            self.close_call();
            if !self.text_open {
                self.body.push_str("<div class=\"msg assistant\">");
                self.text_open = true;
            }
            self.body.push_str(&escape(str_of(&p["text"])));
            return;
        }
        self.close_text();
        if kind.starts_with("tool") {
            return self.tool(kind, p);
        }
        self.close_call();
        self.note(kind, p);
    }

    fn note(&mut self, kind: &str, p: &Value) {
        let line = match kind {
            "run.queued" => "Queued".to_owned(),
            "run.started" => format!("Started on {} (attempt {})", str_of(&p["worker"]), p["attempt"]),
            "sandbox.ready" => format!("Sandbox ready ({})", str_of(&p["image"])),
            "step.started" => {
                self.steps = self.steps.max(p["step"].as_u64().unwrap_or(0));
                let _ = write!(self.body, "<div class=\"ev-step\">Step {}</div>", p["step"]);
                return;
            }
            "step.finished" => self.step_finished(p),
            "todo" => self.plan(p),
            "network.allowed" => {
                format!("Network allowed: {}:{} reached through the egress proxy", str_of(&p["host"]), p["port"])
            }
            "run.succeeded" => {
                let summary = escape(str_of(&p["summary"]));
                let _ = write!(self.body, "<div class=\"end succeeded\"><strong>succeeded</strong>: {summary}</div>");
                return;
            }
            other => format!("{other}: {p}"),
        };
        let _ = write!(self.body, "<div class=\"ev-meta\">{}</div>", escape(&line));
    }

    fn tool(&mut self, kind: &str, p: &Value) {
        match kind {
            "tool_call.started" => {
                self.close_call();
                let name = escape(str_of(&p["name"]));
                let _ = write!(self.body, "<div class=\"tool\"><div class=\"tool-head\">{name}</div>");
                self.call_open = true;
            }
            "tool_call.ready" => {
                let args = &p["arguments"];
                let shown = match (str_of(&p["name"]), args["content"].as_str()) {
                    ("write", Some(content)) => format!("{}\n{content}", str_of(&args["path"])),
                    _ => serde_json::to_string_pretty(args).unwrap_or_default(),
                };
                let _ = write!(self.body, "<pre class=\"args\">{}</pre>", escape(&shown));
            }
            "tool.result" => {
                let output = str_of(&p["output"]);
                let lines = if output.is_empty() { 0 } else { output.trim_end_matches('\n').split('\n').count() };
                let summary =
                    format!("Result · {} ms · {lines} line{}", p["duration_ms"], if lines == 1 { "" } else { "s" });
                let open = if lines <= 20 { " open" } else { "" };
                let _ = write!(
                    self.body,
                    "<details class=\"result\"{open}><summary>{summary}</summary><pre>{}</pre></details>",
                    escape(output)
                );
            }
            // Streamed arguments and output: the ready call and the result
            // replace them on screen, as in the web view.
            _ => {}
        }
    }

    fn step_finished(&mut self, p: &Value) -> String {
        let u = &p["usage"];
        let (input, output) = (u["input_tokens"].as_u64().unwrap_or(0), u["output_tokens"].as_u64().unwrap_or(0));
        let cached = u["cache_read_tokens"].as_u64().unwrap_or(0) + u["cache_write_tokens"].as_u64().unwrap_or(0);
        let cost = p["cost_usd"].as_f64().unwrap_or(0.0);
        (self.input, self.cached, self.output, self.usd) =
            (self.input + input, self.cached + cached, self.output + output, self.usd + cost);
        let cached_text = if cached > 0 { format!(" + {} cached", thousands(cached)) } else { String::new() };
        format!(
            "Step {} finished ({}) · {} in{cached_text} / {} out · ${cost:.4}",
            p["step"],
            str_of(&p["finish_reason"]),
            thousands(input),
            thousands(output)
        )
    }

    fn plan(&mut self, p: &Value) -> String {
        let items = p["items"].as_array().cloned().unwrap_or_default();
        self.body.push_str("<ul class=\"plan\">");
        for item in &items {
            let doing = if item["status"] == "in_progress" { " (in progress)" } else { "" };
            let _ = write!(self.body, "<li>{}{doing}</li>", escape(str_of(&item["text"])));
        }
        self.body.push_str("</ul>");
        format!("Plan updated ({} items)", items.len())
    }

    fn close_text(&mut self) {
        if std::mem::take(&mut self.text_open) {
            self.body.push_str("</div>");
        }
    }

    fn close_call(&mut self) {
        if std::mem::take(&mut self.call_open) {
            self.body.push_str("</div>");
        }
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}
