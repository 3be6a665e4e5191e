//! The capture inside the sandbox: one exec of a script that runs git on
//! the workspace with a store of its own, then bounded reads of what it
//! wrote. Nothing runs git on the worker's side over the sandbox's files.
//!
//! The script's git has its own git directory (`/tmp/kiln-capture/git`,
//! outside `/workspace`, with an empty configuration) and reads the
//! repository's objects through `alternates`: the repository's
//! `.git/config` (hooks, `core.fsmonitor`, filter and diff drivers) is never
//! read, so a `.gitattributes` naming a filter or a diff driver names one
//! that does not exist. On top, the options that neutralise what a
//! configuration could switch on are given on the command line, and no
//! system or global configuration is read. The blobs and trees it writes
//! stay in its own store (the session's next run diffs from the tree), not
//! in the repository.
//!
//! Speed: `git add -A` hashes only the files whose stat data differ from
//! the index it starts from, so the temporary index is seeded with a stat
//! cache when one is at hand: the capture's own index from this session's
//! last capture (kept in `/tmp/kiln-capture/index`), else a copy of the
//! repository's `.git/index` (timestamps kept, so git's racy-entry check
//! still holds). `read-tree -i -m` onto the base then keeps an entry's stat
//! data only where its blob is the base's, so what is tracked is exactly
//! what an empty index given the base would track. Both files are the
//! sandbox's (hostile): git reads them only here, inside the sandbox; one
//! that is not a plain file, is over 64 MiB, does not read, or marks any
//! entry assume-unchanged or skip-worktree (which would hide a change from
//! `add -A`) is dropped for the empty index given the base, the slow path.

use std::time::Duration;

use super::CaptureError;
use super::summary;
use crate::sandbox::FileError;
use crate::sandbox::{Sandbox, SandboxError};

/// Longest the capture may take in the sandbox.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Where the script writes; read back from here.
const OUT: &str = "/tmp/kiln-capture/out";
/// Most bytes of each `-z` summary kept in the sandbox and read back.
const MAX_SUMMARY_BYTES: u64 = 4 * 1024 * 1024;

/// `$1`: what the run's change is diffed from, `$2`: the session's;
/// `$3`: the summaries' cap. Prints `KILN-CAPTURE <tree> <run patch bytes>
/// <session patch bytes or ->` last; on failure, git's last words.
const SCRIPT: &str = r#"set -u
B=$1 S=$2 CAP=$3 K=/tmp/kiln-capture
O=$K/out
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES \
  GIT_EXTERNAL_DIFF GIT_DIFF_OPTS GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_NAMESPACE
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent XDG_CONFIG_HOME=/nonexistent \
  GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 GIT_ATTR_NOSYSTEM=1 GIT_PAGER=cat LC_ALL=C
[ -L "$K" ] && rm -f "$K"
rm -rf "$O" && mkdir -p "$O" || { echo "cannot write $O"; exit 10; }
exec 2>"$O/err"
fail() { tail -c 2000 "$O/err"; exit "$1"; }
[ -f "$K/git/HEAD" ] || git init -q --bare --template= "$K/git" || fail 11
mkdir -p "$K/git/objects/info" || fail 11
if [ -d /workspace/.git/objects ]; then
  printf '%s\n' /workspace/.git/objects > "$K/git/objects/info/alternates"
else
  : > "$K/git/objects/info/alternates"
fi
g() {
  git --git-dir="$K/git" --work-tree=/workspace -c core.bare=false -c safe.directory='*' \
    -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false \
    -c core.excludesFile=/workspace/.git/info/exclude -c core.autocrlf=false -c core.symlinks=true \
    -c core.fileMode=true -c core.quotePath=false -c diff.noprefix=false -c diff.mnemonicPrefix=false \
    -c diff.relative=false -c diff.renames=true "$@"
}
d() { g diff --cached --no-ext-diff --no-textconv --no-color --full-index -M "$@"; }
export GIT_INDEX_FILE="$O/index"
flagged() { g ls-files -v -z | grep -qzv '^H '; [ $? -ne 1 ]; }
seed() {
  [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %s "$1")" -le 67108864 ] || return 1
  $2 -- "$1" "$GIT_INDEX_FILE" && g read-tree -i -m "$B" && ! flagged
}
seed "$K/index" mv || seed /workspace/.git/index 'cp -p' || { rm -f "$GIT_INDEX_FILE"; g read-tree "$B"; } || fail 12
g add -A || fail 13
g write-tree > "$O/tree" & W=$!
scope() {
  d --binary "$1" > "$O/$2.patch" & P=$!
  d --numstat -z "$1" | head -c "$CAP" > "$O/$2.numstat" &
  d --name-status -z "$1" | head -c "$CAP" > "$O/$2.status" &
  wait "$P" || fail 15
}
scope "$B" run
SP=-
if [ "$S" != "$B" ]; then scope "$S" session; SP=$(stat -c %s "$O/session.patch"); fi
wait "$W" && T=$(cat "$O/tree") || fail 14
wait
mv -f "$GIT_INDEX_FILE" "$K/index" 2>/dev/null
printf '\nKILN-CAPTURE %s %s %s\n' "$T" "$(stat -c %s "$O/run.patch")" "$SP"
"#;

/// The image's git is what the capture runs: an image without one is said
/// as such, not as a failed script.
const NEEDS_GIT: &str = "command -v git >/dev/null 2>&1 || { echo KILN-CAPTURE-NEEDS-GIT; exit 3; }\n";
const NEEDS_GIT_SAID: &str = "KILN-CAPTURE-NEEDS-GIT";

/// What the script reported.
#[derive(Debug)]
pub struct Taken {
    /// The tree the workspace was captured at.
    pub tree: String,
    pub run_patch_bytes: u64,
    /// `None`: the session's change is the run's.
    pub session_patch_bytes: Option<u64>,
}

/// One scope's change, read back.
pub struct Read {
    /// `None`: over the bound.
    pub patch: Option<Vec<u8>>,
    pub name_status: Vec<u8>,
    pub numstat: Vec<u8>,
}

/// Runs the script. `base` and `session_base` must be object ids.
pub async fn take(sandbox: &Sandbox, base: &str, session_base: &str) -> Result<Taken, CaptureError> {
    if ![base, session_base].iter().all(|id| super::base::is_object_id(id)) {
        return Err(CaptureError::Garbage(format!("recorded bases {base:?}, {session_base:?} are not object ids")));
    }
    let command = format!("{NEEDS_GIT}set -- {base} {session_base} {MAX_SUMMARY_BYTES}\n{SCRIPT}");
    let out = match sandbox.exec(&command, TIMEOUT, 8192, |_| {}).await {
        Ok(out) => out,
        Err(SandboxError::NoShell { .. }) => return Err(CaptureError::Needs("a shell (sh) and git")),
        Err(e) => return Err(CaptureError::Sandbox(e.to_string())),
    };
    if out.output.lines().any(|l| l == NEEDS_GIT_SAID) {
        return Err(CaptureError::Needs("git"));
    }
    if out.timed_out {
        return Err(CaptureError::Sandbox(format!("the capture took longer than {} s", TIMEOUT.as_secs())));
    }
    if out.exit_code != Some(0) {
        return Err(CaptureError::Script { code: out.exit_code, output: out.output.trim().to_owned() });
    }
    parse_report(&out.output)
}

/// The script's last `KILN-CAPTURE` line, checked.
fn parse_report(output: &str) -> Result<Taken, CaptureError> {
    let line = output.lines().rev().find_map(|l| l.strip_prefix("KILN-CAPTURE "));
    let garbage = || CaptureError::Garbage(format!("unexpected report {:?}", output.trim()));
    let mut parts = line.ok_or_else(garbage)?.split(' ');
    let (Some(tree), Some(run), Some(session), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(garbage());
    };
    if !super::base::is_object_id(tree) {
        return Err(garbage());
    }
    Ok(Taken {
        tree: tree.to_owned(),
        run_patch_bytes: run.parse().map_err(|_| garbage())?,
        session_patch_bytes: match session {
            "-" => None,
            n => Some(n.parse().map_err(|_| garbage())?),
        },
    })
}

/// Reads one scope's output (`run` or `session`); the patch only when it
/// is within `max_patch` (the size checked first, and again by the read).
pub async fn read(sandbox: &Sandbox, scope: &str, patch_bytes: u64, max_patch: u64) -> Result<Read, CaptureError> {
    let patch = match patch_bytes <= max_patch {
        true => match sandbox.read_file(&format!("{OUT}/{scope}.patch"), max_patch).await {
            Ok(patch) => Some(patch),
            Err(FileError::TooLarge { .. }) => None,
            Err(e) => return Err(CaptureError::Sandbox(format!("reading the patch: {e}"))),
        },
        false => None,
    };
    let summary = |kind: &'static str| async move {
        sandbox
            .read_file(&format!("{OUT}/{scope}.{kind}"), MAX_SUMMARY_BYTES)
            .await
            .map_err(|e| CaptureError::Sandbox(format!("reading the summary: {e}")))
    };
    Ok(Read { patch, name_status: summary("status").await?, numstat: summary("numstat").await? })
}

impl Read {
    /// The per-file summary and totals.
    pub fn summary(&self) -> (Vec<kiln_protocol::changes::FileChange>, kiln_protocol::changes::ChangeTotals) {
        summary::summarise(&self.name_status, &self.numstat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_the_last_line_and_is_checked() {
        let tree = "0123456789abcdef0123456789abcdef01234567";
        let ok = parse_report(&format!("warning: x\nKILN-CAPTURE {tree} 12 -\n")).unwrap();
        assert_eq!((ok.tree.as_str(), ok.run_patch_bytes, ok.session_patch_bytes), (tree, 12, None));
        let spoofed = format!("KILN-CAPTURE {tree} 1 2\nKILN-CAPTURE {tree} 3 4\n");
        assert_eq!(parse_report(&spoofed).unwrap().run_patch_bytes, 3);
        for bad in ["", "KILN-CAPTURE x 1 -", &format!("KILN-CAPTURE {tree} -1 -"), &format!("KILN-CAPTURE {tree} 1")] {
            assert!(parse_report(bad).is_err(), "{bad:?}");
        }
    }
}
