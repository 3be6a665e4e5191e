//! `view` of a 1 GB file in the workspace: 2000 lines at line 5,000,001 with
//! Kiln's toolbox against `sed -n '5000001,5002000p;5002000q' f` run by an
//! exec through the Docker API (sed stops at the end of the page, as the
//! first view does; the exec is the plain way a program runs a command in
//! the container, without the Docker CLI's own start-up), then the
//! next page (Kiln continues from where the page ended; sed has no way to
//! and reads from the start again), then the first page against
//! `sed -n '1,2000p;2000q'`.
//!
//! Before each first view the file is touched: its line index is keyed by
//! size, mtime and inode, so every repetition pays what a file never seen
//! costs, rather than reusing the last one's. After Kiln's views the
//! benchmark waits for the toolbox's background line count to finish before
//! anything else is timed, so the count never competes with the baseline;
//! Kiln and sed take turns at going first.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::{api, stats};
use kiln_toolbox::protocol::{Reply, RequestBody, ViewRequest, ViewResult};
use kiln_worker::sandbox::Sandbox;

const FILE: &str = "big.txt";
/// 10-digit line number, a space, 188 filler bytes, newline: 200 bytes.
const LINE_BYTES: u64 = 200;
const LINES: u64 = 5_368_709; // x 200 bytes = 1 GiB (less 24 bytes)
const PAGE: u64 = 2000;
const AT: u64 = 5_000_001;
const GENERATE_TIMEOUT: Duration = Duration::from_secs(900);
const SHORT: Duration = Duration::from_secs(30);
const COUNT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Parser)]
#[command(about = "view paging through a 1 GB file: Kiln vs sed -n '…p;…q'")]
struct Args {
    #[command(flatten)]
    common: Common,
}

#[derive(Default)]
struct Series {
    at: Vec<Duration>,
    next: Vec<Duration>,
    first: Vec<Duration>,
    sed_at: Vec<Duration>,
    sed_first: Vec<Duration>,
    /// From the first view's answer to a view stating the exact total.
    counted: Vec<Duration>,
    scanned_next: u64,
    headers: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = args.common.sandbox_config()?;
    // The 1 GiB file does not fit the default disk bound (1 GiB for the
    // whole workspace), as in `tests/tests/view_large.rs`.
    config.disk_mb = config.disk_mb.max(2048);
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result = run(&docker, &sandbox, args.common.runs).await;
    sandbox.remove().await;
    let s = result?;

    println!(
        "view of a {} byte, {LINES}-line file, pages of {PAGE} lines, image {}:",
        LINES * LINE_BYTES,
        args.common.image
    );
    for h in &s.headers {
        println!("  {h}");
    }
    let at = stats::report("Kiln view offset=5000001 (file not indexed)", &s.at);
    let next = stats::report("Kiln view offset=5002001 (next page)", &s.next);
    let first = stats::report("Kiln view offset=1 (file not indexed)", &s.first);
    let sed_at = stats::report("API exec sed -n '5000001,5002000p;5002000q'", &s.sed_at);
    let sed_first = stats::report("API exec sed -n '1,2000p;2000q'", &s.sed_first);
    stats::report("background count done, after the first view", &s.counted);
    stats::ratio("page at 5,000,001 / sed …q", at, sed_at, Some(1.0));
    stats::ratio("next page / sed …q", next, sed_at, Some(0.1));
    stats::ratio("first page / sed -n '1,2000p;2000q'", first, sed_first, None);
    println!("bytes scanned for the next page: {} (no rescan from the start)", s.scanned_next);
    Ok(())
}

async fn run(docker: &Docker, sandbox: &Sandbox, runs: usize) -> anyhow::Result<Series> {
    let generate = format!(
        "awk 'BEGIN {{ pad = sprintf(\"%{w}s\", \"\"); gsub(/ /, \"x\", pad); \
         for (i = 1; i <= {LINES}; i++) printf \"%010d %s\\n\", i, pad }}' > {FILE} && stat -c %s {FILE}",
        w = LINE_BYTES - 12
    );
    let started = Instant::now();
    let size = setup::bash(sandbox, &generate, GENERATE_TIMEOUT).await?;
    if size.trim() != (LINES * LINE_BYTES).to_string() {
        bail!("generated file has {} bytes, expected {}", size.trim(), LINES * LINE_BYTES);
    }
    eprintln!("generated {FILE} in {:.1} s", started.elapsed().as_secs_f64());

    let sed = |last: u64| async move {
        let script = format!("{},{last}p;{last}q", last + 1 - PAGE);
        api::exec(docker, sandbox.id(), &["sed", "-n", &script, FILE]).await
    };
    let mut s = Series::default();
    for rep in 0..=runs {
        let sed_first = rep % 2 == 1;
        // The page at 5,000,001 and the next one.
        let mut sed_at = None;
        if sed_first {
            sed_at = Some(sed(AT + PAGE - 1).await?);
        }
        setup::bash(sandbox, &format!("touch {FILE}"), SHORT).await?;
        let (took_at, page) = view(sandbox, AT).await?;
        let (took_next, next) = view(sandbox, AT + PAGE).await?;
        let counted = wait_for_count(sandbox).await?;
        if !sed_first {
            sed_at = Some(sed(AT + PAGE - 1).await?);
        }
        let (took_sed, sed_out) = sed_at.context("sed ran")?;
        check_same(&page, &sed_out)?;
        if next.first_line != AT + PAGE || next.last_line != AT + 2 * PAGE - 1 {
            bail!("next page shows lines {}-{}", next.first_line, next.last_line);
        }

        // The first page.
        let mut sed_one = None;
        if sed_first {
            sed_one = Some(sed(PAGE).await?);
        }
        setup::bash(sandbox, &format!("touch {FILE}"), SHORT).await?;
        let (took_first, first) = view(sandbox, 1).await?;
        wait_for_count(sandbox).await?;
        if !sed_first {
            sed_one = Some(sed(PAGE).await?);
        }
        let (took_sed_first, sed_first_out) = sed_one.context("sed ran")?;
        check_same(&first, &sed_first_out)?;
        if rep == 0 {
            s.headers = vec![header(&page), header(&next), header(&first)];
        } else {
            s.at.push(took_at);
            s.next.push(took_next);
            s.first.push(took_first);
            s.sed_at.push(took_sed);
            s.sed_first.push(took_sed_first);
            s.counted.push(counted);
            s.scanned_next = s.scanned_next.max(next.bytes_scanned);
        }
    }
    Ok(s)
}

fn header(v: &ViewResult) -> String {
    v.text.lines().next().unwrap_or_default().to_owned()
}

/// Polls with a cheap view (the page after the one at 5,000,001, which the
/// index has) until the answer states the exact total; how long that took.
async fn wait_for_count(sandbox: &Sandbox) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let (_, v) = view(sandbox, AT + PAGE).await?;
        if v.total_known {
            if v.total_lines != LINES {
                bail!("the count says {} lines, the file has {LINES}", v.total_lines);
            }
            return Ok(started.elapsed());
        }
        if started.elapsed() > COUNT_TIMEOUT {
            bail!("the background count did not finish in {COUNT_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One `view` request as the view tool sends it, except for a byte budget
/// large enough for 2000 of these 200-byte lines (the tool's own answer is
/// capped at 100 KiB, which would show about 490 of them).
async fn view(sandbox: &Sandbox, offset: u64) -> anyhow::Result<(Duration, ViewResult)> {
    let request =
        ViewRequest { offset, limit: PAGE, max_line_chars: 2000, max_bytes: 1024 * 1024, ..ViewRequest::new(FILE) };
    let started = Instant::now();
    let reply = sandbox.toolbox_call(RequestBody::View(request), None).await?;
    let took = started.elapsed();
    match reply {
        Some(Reply::View(v)) if v.last_line + 1 - v.first_line == PAGE => Ok((took, v)),
        Some(Reply::View(v)) => bail!("view at {offset} showed lines {}-{}", v.first_line, v.last_line),
        other => bail!("unexpected reply to view at {offset}: {other:?}"),
    }
}

/// Kiln's page shows the lines sed printed (numbered, after a header).
fn check_same(page: &ViewResult, sed: &[u8]) -> anyhow::Result<()> {
    let sed = std::str::from_utf8(sed).context("sed printed invalid UTF-8")?;
    let sed_lines: Vec<&str> = sed.lines().collect();
    let kiln_lines: Vec<&str> = page.text.lines().filter_map(|l| l.split_once('\t').map(|(_, text)| text)).collect();
    if sed_lines.len() as u64 != PAGE || kiln_lines != sed_lines {
        bail!(
            "Kiln's page (lines {}-{}) differs from sed's ({} lines)",
            page.first_line,
            page.last_line,
            sed_lines.len()
        );
    }
    Ok(())
}
