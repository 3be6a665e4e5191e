//! Times a page load in the browser, by the page's own clock: from the
//! start of the navigation (`performance.timeOrigin`) to the first moment
//! the run's end (`#timeline .end.succeeded`, the last thing either page
//! shows) is in the document, and to the frame after it (laid out and
//! painted).
//!
//! A script that Chromium runs in every new document before the page's own
//! (`Page.addScriptToEvaluateOnNewDocument`, through chromedriver's
//! DevTools endpoint; it is not the page's script, so the web view's
//! Content-Security-Policy does not apply) watches the document's mutations
//! and notes the time when the end appears. Nothing is polled on a timer
//! in the page, and no sleep decides when it is done: the bench reads the
//! noted times once they are there.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fantoccini::Client;
use fantoccini::wd::WebDriverCompatibleCommand;
use serde_json::{Value, json};

const WATCH: &str = r#"(() => {
  const ended = () => document.querySelector('#timeline .end.succeeded') !== null;
  const note = () => {
    window.__benchShown = { dom: performance.now() };
    requestAnimationFrame(() => setTimeout(() => { window.__benchShown.painted = performance.now(); }, 0));
  };
  const watch = new MutationObserver(() => {
    if (ended()) { watch.disconnect(); note(); }
  });
  watch.observe(document, { childList: true, subtree: true });
})();"#;

/// One page load: milliseconds from the navigation's start.
#[derive(Debug, Clone, Copy)]
pub struct Shown {
    /// The run's end is in the document.
    pub dom_ms: f64,
    /// The frame after that has been produced.
    pub painted_ms: f64,
}

/// A DevTools command through chromedriver (`/session/{id}/goog/cdp/execute`).
#[derive(Debug)]
struct Cdp {
    cmd: &'static str,
    params: Value,
}

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/goog/cdp/execute", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({ "cmd": self.cmd, "params": self.params }).to_string()))
    }
}

/// Installs the watch in every document the browser opens from now on.
pub async fn install(client: &Client) -> anyhow::Result<()> {
    let params = json!({ "source": WATCH });
    client.issue_cmd(Cdp { cmd: "Page.addScriptToEvaluateOnNewDocument", params }).await?;
    Ok(())
}

/// Opens `url` from a blank page (a whole new document, nothing of the
/// last one left running) and returns when it showed the run's end.
pub async fn load(client: &Client, url: &str, timeout: Duration) -> anyhow::Result<Shown> {
    client.goto("about:blank").await?;
    client.goto(url).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let v = client.execute("return window.__benchShown || null;", vec![]).await?;
        if let (Some(dom_ms), Some(painted_ms)) = (v["dom"].as_f64(), v["painted"].as_f64()) {
            return Ok(Shown { dom_ms, painted_ms });
        }
        if Instant::now() > deadline {
            bail!("{url} did not show the run's end in {timeout:?} (page state: {v})");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The load event's end on the current page, ms from the navigation's start.
pub async fn load_event_ms(client: &Client) -> anyhow::Result<f64> {
    let v = client.execute("return performance.getEntriesByType('navigation')[0].loadEventEnd;", vec![]).await?;
    v.as_f64().context("no navigation timing")
}
