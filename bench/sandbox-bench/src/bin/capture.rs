//! The capture at a run's end (issue 28) for a 10,000-file repository with
//! 100 changed files: the worker's own capture (`kiln_worker::capture::take`:
//! the toolbox's `capture` subcommand, asked for over the sandbox's toolbox
//! connection, its patch and summary streamed back, bounded; the bench says
//! which way the capture ran), against the plain way
//! to get the same change out of the same container: one exec through the
//! Docker API (the worker's `Sandbox::exec`) of `git add -A && git diff
//! --cached --binary <base>` on the repository's own index, its patch read
//! from the exec's output stream.
//!
//! Warm against warm: one unmeasured round of each first (the baseline's
//! `add -A` refreshes the repository's index; the capture keeps its own
//! index between captures), then the two alternate, A B A B in one round
//! and B A B A in the next. Both see the same workspace every time (the
//! 100 changes stay), so both hash only what changed. Both do a run end's
//! work every time: the capture starts each time from the base's index
//! (it hashes the 100 changed files), and before each baseline sample an
//! unmeasured exec puts back the repository's index as the run's end finds
//! it (the 100 changes not staged; `cp -p` of the index the base was
//! committed with), so its `add -A` stages and hashes them too. With
//! `--keep-baseline-index` the baseline keeps the index its last sample
//! left (the changes already staged: its `add -A` finds nothing to do, so
//! it times less than a run's end). The capture is given what the last one
//! vouched for, as the worker keeps it per session (`--no-vouch`: nothing,
//! as after a takeover, so it checks its seed index's flags each time).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_store::RunBase;
use kiln_worker::sandbox::Sandbox;

const TIMEOUT: Duration = Duration::from_secs(300);
/// Kiln's default `KILN_MAX_PATCH_MB`.
const MAX_PATCH: u64 = 20 * 1024 * 1024;

#[derive(Parser)]
#[command(about = "Capture at run end vs one exec of git add -A && git diff --binary")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Files in the repository.
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Files changed after the base commit.
    #[arg(long, default_value_t = 100)]
    changed: usize,
    /// Let the baseline's repository index keep the changes its last sample
    /// staged, instead of putting back the run end's index each time.
    #[arg(long)]
    keep_baseline_index: bool,
    /// Give the capture no vouch from the last one (as after a takeover):
    /// it checks its seed index's flags every time.
    #[arg(long)]
    no_vouch: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result = async {
        let base = make_repository(&sandbox, args.files, args.changed).await?;
        measure(&sandbox, &base, args.common.runs, !args.keep_baseline_index, !args.no_vouch).await
    }
    .await;
    sandbox.remove().await;
    let (kiln, plain, bytes, ways) = result?;
    let index = if args.keep_baseline_index { "kept staged" } else { "put back to the run end's before each" };
    println!(
        "capture of {} changed files in a {}-file repository ({bytes} patch bytes; baseline's index {index}):",
        args.changed, args.files
    );
    let ways: Vec<&str> = ways.into_iter().collect();
    println!("the capture ran as: {}", ways.join(", "));
    let k = stats::report("Kiln capture (the worker's `capture::take`)", &kiln);
    let p = stats::report("API exec: git add -A && git diff --binary", &plain);
    stats::ratio("Kiln / plain exec", k, p, Some(1.2));
    Ok(())
}

/// `files` files of ~2 KB in 100 directories, committed; then `changed`
/// of them edited. The base commit's id.
async fn make_repository(sandbox: &Sandbox, files: usize, changed: usize) -> anyhow::Result<String> {
    let script = format!(
        r#"set -e
cd /workspace
python3 - <<'PY'
import os, random
random.seed(28)
for i in range({files}):
    d = "d%02d" % (i % 100)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%05d.txt" % (d, i), "w") as f:
        for n in range(30):
            f.write("file %d line %d %s\n" % (i, n, "%032x" % random.getrandbits(128)))
PY
git init -q . && git add -A
git -c user.name=bench -c user.email=bench@example.invalid commit -q -m base
cp -p .git/index /tmp/index-at-end
python3 - <<'PY'
for i in range(0, {files}, max(1, {files} // {changed})):
    d = "d%02d" % (i % 100)
    with open("%s/f%05d.txt" % (d, i), "a") as f:
        f.write("changed by the run\n")
PY
git rev-parse HEAD"#
    );
    let out = setup::bash(sandbox, &script, TIMEOUT).await?;
    let base = out.trim().lines().last().unwrap_or_default().to_owned();
    anyhow::ensure!(base.len() == 40, "no base commit: {out}");
    Ok(base)
}

/// Kiln's and the plain samples, and the patch's size.
async fn measure(
    sandbox: &Sandbox,
    base: &str,
    runs: usize,
    restore_index: bool,
    keep_vouch: bool,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, u64, BTreeSet<&'static str>)> {
    let run_base = RunBase {
        base: base.to_owned(),
        base_commit: Some(base.to_owned()),
        session_base: base.to_owned(),
        session_base_commit: Some(base.to_owned()),
    };
    let plain_command = format!("git add -A && git diff --cached --binary {base}");
    let (mut kiln, mut plain, mut bytes, mut ways) = (vec![], vec![], 0, BTreeSet::new());
    // What the worker keeps between a session's captures.
    let mut vouch = kiln_worker::capture::Vouch::default();
    for round in 0..=runs {
        for kiln_first in [round % 2 == 0, round % 2 != 0] {
            if kiln_first {
                let started = Instant::now();
                let captured = kiln_worker::capture::take(sandbox, &run_base, MAX_PATCH, &vouch).await?;
                let own = captured.own;
                ways.insert(captured.way.as_str());
                if keep_vouch {
                    vouch = captured.vouch;
                }
                let took = started.elapsed();
                anyhow::ensure!(!own.too_large && own.patch.is_some(), "the capture's patch is missing");
                bytes = own.patch_bytes;
                if round > 0 {
                    kiln.push(took);
                }
            } else {
                if restore_index {
                    setup::bash(sandbox, "cp -p /tmp/index-at-end /workspace/.git/index", TIMEOUT).await?;
                }
                let started = Instant::now();
                let out = sandbox.exec(&plain_command, TIMEOUT, MAX_PATCH as usize, |_| {}).await?;
                let took = started.elapsed();
                anyhow::ensure!(out.exit_code == Some(0) && !out.output.is_empty(), "plain exec: {:?}", out.exit_code);
                if round > 0 {
                    plain.push(took);
                }
            }
        }
    }
    Ok((kiln, plain, bytes, ways))
}
