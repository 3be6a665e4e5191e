//! Workloads the runtime and disk benchmarks put into a sandbox (a tree to
//! grep, a git repository, a gigabyte workspace), and the timed calls they
//! make on them, each through the toolbox as the agent's tools make them.

use std::time::{Duration, Instant};

use anyhow::bail;
use kiln_toolbox::protocol::defaults::GREP_MAX_RESULTS;
use kiln_toolbox::protocol::{GrepRequest, Reply, RequestBody};
use kiln_worker::sandbox::Sandbox;

use crate::setup;

/// Long enough for building a gigabyte on a loaded machine.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(900);
/// For one measured command.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The word the grep figures look for: in one file of ten.
pub const NEEDLE: &str = "kilnneedle";

/// `files` text files of ~4 KB under `dir` (10 directories), one in ten
/// holding [`NEEDLE`] on one line.
pub async fn grep_tree(sandbox: &Sandbox, dir: &str, files: usize) -> anyhow::Result<()> {
    let script = format!(
        r#"set -e
mkdir -p {dir} && cd {dir}
python3 - <<'PY'
import os, random
random.seed(30)
for i in range({files}):
    d = "d%d" % (i % 10)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%05d.txt" % (d, i), "w") as f:
        for n in range(60):
            word = "{NEEDLE}" if i % 10 == 0 and n == 30 else "%032x" % random.getrandbits(128)
            f.write("file %d line %d %s\n" % (i, n, word))
PY"#
    );
    setup::bash(sandbox, &script, BUILD_TIMEOUT).await.map(drop)
}

/// A git repository at `dir` of `files` files of ~2 KB in 100 directories,
/// committed and clean (as `capture` builds it), one in ten holding
/// [`NEEDLE`].
pub async fn repository(sandbox: &Sandbox, dir: &str, files: usize) -> anyhow::Result<()> {
    let script = format!(
        r#"set -e
mkdir -p {dir} && cd {dir}
python3 - <<'PY'
import os, random
random.seed(28)
for i in range({files}):
    d = "d%02d" % (i % 100)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%05d.txt" % (d, i), "w") as f:
        for n in range(30):
            word = "{NEEDLE}" if i % 10 == 0 and n == 15 else "%032x" % random.getrandbits(128)
            f.write("file %d line %d %s\n" % (i, n, word))
PY
git init -q . && git add -A
git -c user.name=bench -c user.email=bench@example.invalid commit -q -m base"#
    );
    setup::bash(sandbox, &script, BUILD_TIMEOUT).await.map(drop)
}

/// Adds `mib` MiB of text files (1 MiB each, without [`NEEDLE`]) under
/// `dir/deps`, which the repository at `dir` ignores: a checkout's
/// dependencies, as a real workspace holds them.
pub async fn dependencies(sandbox: &Sandbox, dir: &str, mib: usize) -> anyhow::Result<()> {
    let script = format!(
        r#"set -e
cd {dir} && echo deps/ > .gitignore && mkdir -p deps
python3 - <<'PY'
import os
line = ("x" * 99 + "\n").encode()
chunk = line * (1048576 // len(line)) + b"y" * (1048576 % len(line))
for i in range({mib}):
    d = "deps/p%02d" % (i % 50)
    os.makedirs(d, exist_ok=True)
    with open("%s/m%05d.js" % (d, i), "wb") as f:
        f.write(chunk)
PY
sync"#
    );
    setup::bash(sandbox, &script, BUILD_TIMEOUT).await.map(drop)
}

/// Runs `command` through the toolbox and times the call.
pub async fn timed_bash(sandbox: &Sandbox, command: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    setup::bash(sandbox, command, CALL_TIMEOUT).await?;
    Ok(started.elapsed())
}

/// The `grep` tool's call (the toolbox's own search, the tool's result
/// cap) for [`NEEDLE`] under `path`, timed; fails unless it finds
/// `expected` matching lines.
pub async fn toolbox_grep(sandbox: &Sandbox, path: &str, expected: u64) -> anyhow::Result<Duration> {
    let request = GrepRequest {
        pattern: NEEDLE.into(),
        path: Some(path.into()),
        include: None,
        literal: false,
        case_insensitive: false,
        context: 0,
        max_results: GREP_MAX_RESULTS,
    };
    let started = Instant::now();
    let reply = sandbox.toolbox_call(RequestBody::Grep(request), None).await?;
    let took = started.elapsed();
    match reply {
        Some(Reply::Grep(r)) if r.total_matches == expected => Ok(took),
        Some(Reply::Grep(r)) => bail!("grep found {} matches under {path}, not {expected}", r.total_matches),
        other => bail!("unexpected reply to grep: {other:?}"),
    }
}

/// The two orders of a pair: A then B on even repetitions, B then A on
/// odd ones, so that neither always goes first.
pub fn order(rep: usize) -> [usize; 2] {
    if rep.is_multiple_of(2) { [0, 1] } else { [1, 0] }
}
