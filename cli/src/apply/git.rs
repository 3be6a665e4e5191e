//! `git` as `kiln apply` runs it on this machine: with no system or global
//! configuration (a person's `apply.whitespace=fix` or `core.autocrlf`
//! would change the bytes applied, and their pager or credential prompts
//! have no place here), in C locale so its messages read the same
//! everywhere, and with none of the `GIT_*` variables that would point it
//! at another repository, index or object store than the one named.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Variables that redirect git away from the repository in `dir`.
const REDIRECTING: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
];

#[derive(Debug, thiserror::Error)]
#[error("running git {args}: {source}")]
pub struct GitError {
    args: String,
    source: std::io::Error,
}

/// `git args` in `dir`, `input` on its stdin; its output whatever its exit.
pub fn run(dir: &Path, args: &[&str], input: Option<&[u8]>) -> Result<Output, GitError> {
    let failed = |source| GitError { args: args.join(" "), source };
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env("LC_ALL", "C")
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in REDIRECTING {
        cmd.env_remove(name);
    }
    let mut child = cmd.spawn().map_err(failed)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A git that exits early (a bad patch) closes the pipe: its exit
        // status says what happened, not this write.
        let _ = stdin.write_all(input);
    }
    child.wait_with_output().map_err(failed)
}

/// `git args` in `dir`; its stdout, trimmed, or `None` when it failed.
pub fn answer(dir: &Path, args: &[&str]) -> Result<Option<String>, GitError> {
    let out = run(dir, args, None)?;
    Ok(out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned()))
}

/// What git said on stderr, trimmed.
pub fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}
