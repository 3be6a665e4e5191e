//! The web view showing an ended run of 5,000 events, in headless
//! Chromium: from the start of the navigation to the page showing the
//! run's end (the last event; the page renders in seq order) and the frame
//! after it, for the release `kiln serve`'s web view against the best plain
//! way to show the same events: one static HTML page, rendered once on the
//! server, served by a plain axum server on loopback (`static_page`).
//!
//! One browser session for both, one tab: the first load of each is
//! reported as cold, then the two alternate warm against warm (Kiln first
//! in the first half of the samples, the baseline first in the second).

mod long_run;
mod page_clock;
mod static_page;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use fantoccini::Client;
use kiln_bench::{Server, Summary, database, http, kiln_binary, token};
use kiln_tests::browser::Browser;
use page_clock::Shown;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Events in the run (`run.queued` to `run.succeeded`).
    #[arg(long, default_value_t = 5000)]
    events: usize,
    /// Warm loads of each page (even: half with Kiln first, half with the baseline first).
    #[arg(long, default_value_t = 24)]
    samples: usize,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

const OWNER: &str = "bench";
const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let load_before = loadavg();
    let (db_url, _store) = database().await?;
    let server = Server::kiln_serve(&kiln, &db_url, &[]).await?;
    let run = stored_run(&server, &db_url, args.events).await?;
    let events = read_events(&db_url, &run).await?;
    let html = static_page::render(&events);
    let plain = static_page::serve(html.clone()).await?;
    println!(
        "kiln: {} (bench build: {}); {} events stored; static page {} KB",
        kiln.display(),
        if cfg!(debug_assertions) { "debug" } else { "release" },
        events.len(),
        html.len() / 1024
    );
    let browser = Browser::start("web_view bench", 1100, 1400).await.context("no headless Chromium")?;
    page_clock::install(&browser.client).await?;
    sign_in(&browser.client, &format!("http://{}", server.addr)).await?;
    let pages = [("kiln", format!("http://{}/#/runs/{run}", server.addr)), ("static", format!("http://{plain}/"))];
    let measured = measure(&browser.client, &pages, args.samples).await?;
    report(&measured, &pages);
    let (stream, pages) = read_times(&server, &run, 10).await?;
    println!("\nfor reference, a plain HTTP client (no browser) reading the run's 5,000 events from kiln serve:");
    println!("  as the event stream (SSE), to its end: {stream}");
    println!("  as JSON pages of 500 (GET …/events?after=N&limit=500, in turn): {pages}");
    println!("load average before: {load_before}; after: {}", loadavg());
    browser.client.clone().close().await?;
    drop(browser);
    drop(server);
    kiln_bench::drop_databases().await
}

/// A run of `count` events, ended, through the API (its `run.queued`) and
/// then straight into the store, as the web view's test stores one.
async fn stored_run(server: &Server, db_url: &str, count: usize) -> anyhow::Result<String> {
    let created: serde_json::Value = http()?
        .post(format!("http://{}/v1/runs", server.addr))
        .bearer_auth(token(OWNER)?)
        .json(&json!({"prompt": "Make the parser accept CRLF line endings and keep the tests passing."}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = created["id"].as_str().context("the run's id")?.to_owned();
    let rest = long_run::events(count - 1);
    let seqs: Vec<i64> = (2..=count as i64).collect();
    let kinds: Vec<String> = rest.iter().map(|(k, _)| k.clone()).collect();
    let payloads: Vec<String> = rest.iter().map(|(_, p)| p.to_string()).collect();
    let sql = kiln_bench::connect(db_url).await?;
    sql.execute(
        "INSERT INTO events (run_id, seq, kind, payload)
         SELECT $1::text::uuid, s, k, p::jsonb FROM unnest($2::bigint[], $3::text[], $4::text[]) AS t(s, k, p)",
        &[&id, &seqs, &kinds, &payloads],
    )
    .await?;
    sql.execute(
        "UPDATE runs SET status = 'succeeded', last_event_seq = $2, started_at = now(), finished_at = now()
         WHERE id = $1::text::uuid",
        &[&id, &(count as i64)],
    )
    .await?;
    Ok(id)
}

/// The run's events as stored, in seq order: what both pages show.
async fn read_events(db_url: &str, run: &str) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let sql = kiln_bench::connect(db_url).await?;
    let rows =
        sql.query("SELECT kind, payload::text FROM events WHERE run_id = $1::text::uuid ORDER BY seq", &[&run]).await?;
    rows.iter().map(|r| Ok((r.get::<_, String>(0), serde_json::from_str(r.get::<_, &str>(1))?))).collect()
}

/// How long `kiln serve` takes to send the whole run to a client that
/// only reads it, as the stream and as JSON pages: the server's part of the
/// web view's time.
async fn read_times(server: &Server, run: &str, samples: usize) -> anyhow::Result<(Summary, Summary)> {
    let (client, bearer) = (http()?, token(OWNER)?);
    let url = format!("http://{}/v1/runs/{run}/events", server.addr);
    let (mut stream, mut pages) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let started = std::time::Instant::now();
        let sse = client.get(format!("{url}?after=0")).bearer_auth(&bearer).header("accept", "text/event-stream");
        let body = sse.send().await?.error_for_status()?.bytes().await?;
        stream.push(started.elapsed());
        if !body.windows(13).any(|w| w == b"run.succeeded") {
            bail!("the stream ended without the run's end");
        }
        let started = std::time::Instant::now();
        let mut after = 0;
        loop {
            let page: serde_json::Value = client
                .get(format!("{url}?after={after}&limit=500"))
                .bearer_auth(&bearer)
                .header("accept", "application/json")
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let Some(last) = page["events"].as_array().and_then(|e| e.last()) else { break };
            after = last["seq"].as_i64().context("an event's seq")?;
        }
        pages.push(started.elapsed());
    }
    Ok((Summary::of(stream), Summary::of(pages)))
}

/// Puts the token in the tab's session storage for Kiln's origin, where the
/// web view keeps the one a person pastes, without loading the web view
/// (its first load is the cold sample).
async fn sign_in(client: &Client, site: &str) -> anyhow::Result<()> {
    client.goto(&format!("{site}/readyz")).await?;
    client.execute("sessionStorage.setItem('kiln.token', arguments[0]);", vec![json!(token(OWNER)?)]).await?;
    Ok(())
}

/// Loads and timings: `[kiln, static]`, each a cold load and the warm ones.
struct Measured {
    cold: [Shown; 2],
    warm: [Vec<Shown>; 2],
    static_load_event: Vec<f64>,
}

async fn measure(client: &Client, pages: &[(&str, String); 2], samples: usize) -> anyhow::Result<Measured> {
    if samples < 2 || !samples.is_multiple_of(2) {
        bail!("--samples must be even and at least 2");
    }
    let cold = [load_checked(client, &pages[0]).await?, load_checked(client, &pages[1]).await?];
    let mut measured = Measured { cold, warm: [Vec::new(), Vec::new()], static_load_event: Vec::new() };
    for i in 0..samples {
        let order = if i < samples / 2 { [0, 1] } else { [1, 0] };
        for side in order {
            let shown = page_clock::load(client, &pages[side].1, TIMEOUT).await?;
            if side == 1 {
                measured.static_load_event.push(page_clock::load_event_ms(client).await?);
            }
            measured.warm[side].push(shown);
        }
    }
    Ok(measured)
}

/// A load, then what it shows: its tool calls, its end, and (the web view
/// marks each element with the seqs it shows) up to which seq it shows
/// every event once, in order.
async fn load_checked(client: &Client, (name, url): &(&str, String)) -> anyhow::Result<Shown> {
    let shown = page_clock::load(client, url, TIMEOUT).await?;
    let seen = client
        .execute(
            "const ranges = Array.from(document.querySelectorAll('#timeline [data-from]'), \
                 (n) => [Number(n.dataset.from), Number(n.dataset.to)]).sort((a, b) => a[0] - b[0]); \
             let next = 1; \
             for (const [from, to] of ranges) { if (from !== next) break; next = to + 1; } \
             return { tools: document.querySelectorAll('#timeline .tool').length, \
                      seqs_in_order_from_1: next - 1, \
                      end: document.querySelector('#timeline .end.succeeded').textContent };",
            vec![],
        )
        .await?;
    println!("{name}: cold load showed {seen}");
    // Where the time went: each request the page made, ms from the navigation's start.
    let requests = client
        .execute(
            "return performance.getEntriesByType('resource').map((e) => \
               `${e.name.split('?')[0].replace(location.origin, '')} ${Math.round(e.startTime)}..${Math.round(e.responseEnd)}`);",
            vec![],
        )
        .await?;
    println!("{name}: requests (ms) {requests}; shown at {:.0} ms (painted {:.0})", shown.dom_ms, shown.painted_ms);
    Ok(shown)
}

fn report(m: &Measured, pages: &[(&str, String); 2]) {
    let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
    for (what, pick) in [("painted", (|s: &Shown| s.painted_ms) as fn(&Shown) -> f64), ("in the DOM", |s| s.dom_ms)] {
        let sums: Vec<Summary> = m.warm.iter().map(|w| Summary::of(w.iter().map(|s| ms(pick(s))).collect())).collect();
        println!("\nwarm, run's end {what} (navigation start ->):");
        for (side, s) in sums.iter().enumerate() {
            println!("  {:6} {s}", pages[side].0);
        }
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "  ratio kiln/static: p50 {:.2}x, p95 {:.2}x",
            ratio(sums[0].p50, sums[1].p50),
            ratio(sums[0].p95, sums[1].p95)
        );
    }
    let load_event = Summary::of(m.static_load_event.iter().map(|v| ms(*v)).collect());
    println!("\nstatic page's load event end (warm): {load_event}");
    println!(
        "cold (first load of each in the session): kiln painted {:.1} ms (DOM {:.1}), static painted {:.1} ms (DOM {:.1}), ratio {:.2}x",
        m.cold[0].painted_ms,
        m.cold[0].dom_ms,
        m.cold[1].painted_ms,
        m.cold[1].dom_ms,
        m.cold[0].painted_ms / m.cold[1].painted_ms
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
