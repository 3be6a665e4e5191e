//! The capture inside the sandbox: one exec that runs git on the workspace
//! with a store of its own and sends everything back on that exec's own
//! stdout, framed and bounded. Nothing runs git on the worker's side over
//! the sandbox's files.
//!
//! The exec is the worker's own toolbox binary's `capture` subcommand
//! (`toolbox/src/change_capture`) wherever that toolbox runs the sandbox's
//! tools: one process that runs git three times and does the rest itself.
//! Where it does not (an image's own toolbox, per-exec mode, a toolbox from
//! before the subcommand), the shell script below takes the same steps and
//! sends the same output; what follows describes both.
//!
//! The script's git has its own git directory (`/tmp/kiln-capture/git`,
//! outside `/workspace`, its configuration written afresh and its `info/`
//! removed at every capture: the agent can write that directory between
//! runs, and a configuration of its own there (`core.ignoreStat`, which
//! has git mark what it adds assume-unchanged, so an index the worker
//! vouches for would hide the next change) or an `info/exclude` (which
//! hides a new file from `add -A`) must not be taken) and reads the
//! repository's objects through `alternates`: the repository's
//! `.git/config` (hooks, `core.fsmonitor`, filter and diff drivers) is never
//! read, so a `.gitattributes` naming a filter or a diff driver names one
//! that does not exist. On top, the options that neutralise what a
//! configuration could switch on are given on the command line, and no
//! system or global configuration is read. The blobs and trees it writes
//! stay in its own store (the session's next run diffs from the tree), not
//! in the repository.
//!
//! Speed: `git add -A` hashes only the files whose stat data differ from the
//! index it starts from, so the temporary index is seeded with a stat cache
//! when one is at hand, and made to track exactly what an empty index given the
//! base would track (`read-tree -i -m <base>`: an entry keeps its stat data
//! only where its blob is the base's). That read-tree reads the whole index and
//! the base's trees and writes the index again, so it is skipped when the
//! seed's entries already are the base's: the capture's own index from this
//! session's last capture when that capture's tree is this run's base (a
//! follow-up run: `index.tree` names it), or the index as the last read-tree
//! onto this same base left it (`base`, a hard link git's next write of the
//! index leaves alone; `base.tree` names its base). Else it seeds from the
//! capture's own index, then a copy of the repository's `.git/index`
//! (timestamps kept, so git's racy-entry check still holds), and runs the
//! read-tree. These files are the sandbox's (hostile): git reads them only
//! here, inside the sandbox, and what they can do is what a forged stat cache
//! can (make `add -A` take an entry's stat data on trust), nothing more; one
//! that is not a plain file, is over 64 MiB, does not read, or marks any entry
//! assume-unchanged or skip-worktree (which would hide a change from `add -A`)
//! is dropped for the empty index given the base, the slow path. The flag check
//! (one more git command reading the whole index) is passed over for a seed the
//! worker vouches for ([`super::vouch`]): one whose whole content hashes
//! (SHA-256: one `sha256sum`, in place of the size check's `stat`) to an index
//! a capture wrote, as the script reports it (one more `sha256sum`, beside the
//! diff); an index's own trailing checksum would not do (git does not verify it
//! on reading, so an edited index can keep its old one). git is told to write
//! no split index (`core.splitIndex=false`), so what is hashed is the whole
//! index, not a part of it whose shared half the sandbox could change. The
//! index is then read by three or four git commands (`add -A`, `write-tree`,
//! the flag check when it runs and, per scope, one diff; the last three at
//! once), against the two of a plain `add -A && diff`: each scope's diff gives
//! the summary and the patch in one go (`--raw -z --binary`: the listing, a
//! NUL, the patch), so the index, the base's trees and the renames are read and
//! found once; the worker reads the line counts off the patch
//! ([`super::count`]) rather than have git diff every file twice (`--numstat`).
//!
//! The read back: the script writes git's output to files first (so it
//! knows their sizes), then prints one header line and the outputs
//! themselves on its own stdout, a patch only when it is within the bound
//! (over it, the listing is taken again on its own, capped). The worker
//! reads at most what the bound allows ([`stdout_cap`]) and accepts only
//! output whose length is exactly what the header announced: no second
//! exec, no file transfer.

use std::time::Duration;

use super::CaptureError;
use super::count::{Counts, count_patch};
use crate::sandbox::{RawOutput, Sandbox};
use crate::vouches::Vouch;

/// Longest the capture may take in the sandbox.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Most bytes of a scope's `-z` listing sent on its own (the patch over
/// the bound).
const MAX_SUMMARY_BYTES: u64 = 8 * 1024 * 1024;
/// Longest header line accepted.
const MAX_HEADER: usize = 512;
/// Exit statuses of GNU `timeout` when it stopped the script.
const TIMED_OUT: [i64; 2] = [124, 137];

/// `$1`: what the run's change is diffed from, `$2`: the session's;
/// `$3`: the summaries' cap; `$4`: the patches' bound; `$5`, `$6`: the
/// SHA-256 the worker vouches for of the kept index and of the base's
/// index, or `-` ([`Vouch`]). On stdout, and nothing else there:
/// `KILN-CAPTURE <tree>`, the SHA-256 of the index and the base's index as
/// it leaves them (`-`: none), the run's scope, the session's (`- - -`:
/// the run's), a newline, then what the scopes' fields announce, in order. A scope is `d - <n>`: git's whole output (the
/// `--raw -z` listing, a NUL, the patch), `n` bytes; or, when that is over
/// `$3 + $4 + 1`, `s <p> <n>`: the patch's size `p`, the patch itself only
/// when within `$4`, then the first `n` bytes of the `--raw --numstat -z`
/// listing. On failure, git's last words on stderr.
const SCRIPT: &str = r#"set -u
B=$1 S=$2 CAP=$3 MAXP=$4 VI=$5 VB=$6 K=/tmp/kiln-capture
O=$K/out
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES \
  GIT_EXTERNAL_DIFF GIT_DIFF_OPTS GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_NAMESPACE
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent XDG_CONFIG_HOME=/nonexistent \
  GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 GIT_ATTR_NOSYSTEM=1 GIT_PAGER=cat LC_ALL=C
[ -L "$K" ] && rm -f "$K"
[ -d "$O" ] && [ ! -L "$O" ] || { rm -rf "$O" && mkdir -p "$O"; } || { echo "cannot write $O" >&2; exit 10; }
exec 3>&1 4>&2 >"$O/err" 2>&1
fail() { tail -c 2000 "$O/err" >&4; exit "$1"; }
[ -L "$K/git" ] && rm -f "$K/git"
[ -f "$K/git/HEAD" ] || git init -q --bare --template= "$K/git" || fail 11
[ -d "$K/git/objects/info" ] || mkdir -p "$K/git/objects/info" || fail 11
rm -rf "$K/git/config" "$K/git/info" "$K/git/commondir" || fail 11
printf '[core]\n\trepositoryformatversion = 0\n\tbare = true\n' > "$K/git/config" || fail 11
if [ -d /workspace/.git/objects ]; then
  printf '%s\n' /workspace/.git/objects > "$K/git/objects/info/alternates"
else
  : > "$K/git/objects/info/alternates"
fi
g() {
  git --git-dir="$K/git" --work-tree=/workspace -c core.bare=false -c safe.directory='*' \
    -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false -c core.splitIndex=false \
    -c core.ignoreStat=false -c core.sparseCheckout=false \
    -c core.excludesFile=/workspace/.git/info/exclude -c core.autocrlf=false -c core.symlinks=true \
    -c core.fileMode=true -c core.quotePath=false -c diff.noprefix=false -c diff.mnemonicPrefix=false \
    -c diff.relative=false -c diff.renames=true "$@"
}
d() { g diff --cached --no-ext-diff --no-textconv --no-color --full-index -M --raw -z "$@"; }
I=$K/index
export GIT_INDEX_FILE="$I"
IT= BT=
read -r IT < "$K/index.tree" 2>/dev/null
read -r BT < "$K/base.tree" 2>/dev/null
: > "$K/index.tree" || fail 11
flagged() { g ls-files -v -z | grep -qzv '^H '; [ $? -ne 1 ]; }
fit() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %s "$1")" -le 67108864 ]; }
vouched() {
  [ "$2" != - ] && [ -f "$1" ] && [ ! -L "$1" ] && h=$(sha256sum < "$1") && [ "${h%% *}" = "$2" ] && V=1
}
kept() {
  V=
  [ "$IT" = "$B" ] && { vouched "$I" "$VI" || fit "$I"; } && return
  [ "$BT" = "$B" ] && { vouched "$K/base" "$VB" || fit "$K/base"; } && ln -f -- "$K/base" "$I"
}
seed() {
  V=
  { vouched "$1" "$VI" || fit "$1"; } || return 1
  { [ "$1" = "$I" ] || cp -p -- "$1" "$I"; } && g read-tree -i -m "$B" || return 1
  : > "$K/base.tree" && ln -f -- "$I" "$K/base" && printf '%s\n' "$B" > "$K/base.tree" && VB=+
  return 0
}
empty() { rm -f "$I" "$K/base" "$K/base.tree"; VB=-; g read-tree "$B" || fail 12; }
take() {
  g add -A || fail 13
  { g write-tree > "$O/tree" && { sha256sum < "$I" > "$O/sum" || : > "$O/sum"; }; } & W=$!
  if [ "${1-}" = check ]; then flagged & F=$!; fi
  d --binary "$B" > "$O/run.diff" || fail 15
  [ "$S" = "$B" ] || d --binary "$S" > "$O/session.diff" || fail 15
  wait "$W" && read -r T < "$O/tree" || fail 14
  [ "${1-}" = check ] && wait "$F"
}
if kept || { V=; seed "$I"; } || { rm -f "$I"; seed /workspace/.git/index; }; then
  if [ -n "$V" ]; then take; else take check && { empty; take; }; fi
else
  empty; take
fi
[ "$VB" = + ] && { h=$(sha256sum < "$K/base") && VB=${h%% *} || VB=-; }
VI=-
read -r VI _ < "$O/sum"
printf '%s\n' "$T" > "$K/index.tree" || fail 16
H="KILN-CAPTURE $T ${VI:--} $VB" SEND=
scope() {
  if [ "$3" -le $((CAP + MAXP + 1)) ]; then H="$H d - $3" SEND="$SEND $O/$1.diff"; return; fi
  d --numstat "$2" > "$O/$1.list" && d "$2" > "$O/$1.raw" || fail 15
  head -c "$CAP" "$O/$1.list" > "$O/$1.sent" || fail 16
  local n p; n=$(stat -c %s "$O/$1.raw" "$O/$1.sent") || fail 16
  p=$(($3 - ${n%%[!0-9]*} - 1))
  H="$H s $p ${n##*[!0-9]}"
  if [ "$p" -le "$MAXP" ]; then tail -c "$p" "$O/$1.diff" > "$O/$1.patch" && SEND="$SEND $O/$1.patch" || fail 16; fi
  SEND="$SEND $O/$1.sent"
}
if [ "$S" = "$B" ]; then
  N=$(stat -c %s "$O/run.diff") || fail 16
  scope run "$B" "$N"
  H="$H - - -"
else
  N=$(stat -c %s "$O/run.diff" "$O/session.diff") || fail 16
  scope run "$B" "${N%%[!0-9]*}"
  scope session "$S" "${N##*[!0-9]}"
fi
{ printf '%s\n' "$H" && cat $SEND; } >&3 || fail 16
"#;

/// The image's git is what the capture runs: an image without one is said
/// as such (exit [`NEEDS_GIT_EXIT`]), not as a failed script.
const NEEDS_GIT: &str = "command -v git >/dev/null 2>&1 || exit 3\n";
const NEEDS_GIT_EXIT: i64 = 3;

/// One scope's change as the script sent it.
#[derive(Debug, PartialEq, Eq)]
pub struct Scope {
    pub patch_bytes: u64,
    /// `None`: over the bound (not sent, or dropped).
    pub patch: Option<Vec<u8>>,
    /// git's `--raw -z` listing; with `--numstat` when the patch was not
    /// sent whole.
    pub summary: Vec<u8>,
    /// The patch's line counts per file section, read off the whole output
    /// (also when the patch is then dropped as over the bound); `None`:
    /// the listing has them.
    pub counted: Option<Vec<Counts>>,
}

/// What the script sent.
#[derive(Debug)]
pub struct Taken {
    /// The tree the workspace was captured at.
    pub tree: String,
    pub run: Scope,
    /// `None`: the session's change is the run's.
    pub session: Option<Scope>,
    /// What the next capture may take on trust.
    pub vouch: Vouch,
    /// How it was taken.
    pub way: Way,
}

/// How a capture ran: the same steps and output each way, at different
/// costs (an exec through the engine is tens of milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The worker's toolbox's `capture` subcommand, asked for over the
    /// sandbox's toolbox connection.
    ToolboxCall,
    /// The same subcommand, by an exec through the engine (a sandbox whose
    /// tools are one exec each, or a toolbox that does not take the call).
    ToolboxExec,
    /// The shell script, by an exec: no toolbox of the worker's here.
    Script,
}

impl Way {
    pub fn as_str(self) -> &'static str {
        match self {
            Way::ToolboxCall => "toolbox call",
            Way::ToolboxExec => "toolbox exec",
            Way::Script => "script",
        }
    }
}

/// Runs the script and reads what it sends. `base` and `session_base`
/// must be object ids.
pub async fn take(
    sandbox: &Sandbox,
    base: &str,
    session_base: &str,
    max_patch: u64,
    vouch: &Vouch,
) -> Result<Taken, CaptureError> {
    if ![base, session_base].iter().all(|id| super::base::is_object_id(id)) {
        return Err(CaptureError::Garbage(format!("recorded bases {base:?}, {session_base:?} are not object ids")));
    }
    let [index, kept_base] = vouch.args();
    let (cap, max) = (MAX_SUMMARY_BYTES.to_string(), max_patch.to_string());
    if let Some(toolbox) = sandbox.workers_toolbox() {
        let args = [base, session_base, &cap, &max, index, kept_base];
        match sandbox.capture_by_toolbox(&args, stdout_cap(max_patch), TIMEOUT).await {
            Ok(Some(out)) => return read(checked(out)?, max_patch, Way::ToolboxCall),
            Ok(None) => {}
            // Whatever broke the call, the exec below does the same work.
            Err(e) => tracing::debug!(error = %e, "the capture over the toolbox's connection failed; by an exec"),
        }
        let argv = [toolbox, "capture", base, session_base, &cap, &max, index, kept_base];
        let out = run(sandbox, &argv, max_patch).await?;
        if !cannot_capture(&out) {
            return read(out, max_patch, Way::ToolboxExec);
        }
        // No toolbox of the worker's there after all (its copy failed), or
        // one from before the capture was in it (a sandbox adopted across an
        // upgrade): the script does the same.
        tracing::debug!("the sandbox's toolbox cannot capture; taking the change with the script");
    }
    // The session's shell (bash, else sh: the script is POSIX); an image
    // without one cannot run the capture at all.
    let shell = match sandbox.shell() {
        Some(known) => known.program().ok_or(CaptureError::Needs("a shell (sh) and git"))?,
        None => "sh",
    };
    let command = format!("{NEEDS_GIT}set -- {base} {session_base} {cap} {max} {index} {kept_base}\n{SCRIPT}");
    read(run(sandbox, &[shell, "-c", &command], max_patch).await?, max_patch, Way::Script)
}

/// Runs the capture, its stdout read within the bound.
async fn run(sandbox: &Sandbox, argv: &[&str], max_patch: u64) -> Result<RawOutput, CaptureError> {
    let out = sandbox
        .exec_raw(argv, None, stdout_cap(max_patch), TIMEOUT)
        .await
        .map_err(|e| CaptureError::Sandbox(e.to_string()))?;
    checked(out)
}

/// The output, unless it went past its bound.
fn checked(out: RawOutput) -> Result<RawOutput, CaptureError> {
    if out.overflow {
        return Err(CaptureError::Garbage("the capture sent more than its bound".into()));
    }
    Ok(out)
}

/// The toolbox was not there to run (126, 127: `timeout` could not start
/// it), or did not know the subcommand (it says how it is used).
fn cannot_capture(out: &RawOutput) -> bool {
    matches!(out.exit_code, Some(126 | 127))
        || out.exit_code == Some(2) && out.stderr.starts_with("usage: kiln-toolbox")
}

/// What the capture's exit status and output say.
fn read(out: RawOutput, max_patch: u64, way: Way) -> Result<Taken, CaptureError> {
    match out.exit_code {
        Some(0) => parse_output(out.stdout, max_patch, way),
        Some(NEEDS_GIT_EXIT) => Err(CaptureError::Needs("git")),
        Some(code) if TIMED_OUT.contains(&code) => {
            Err(CaptureError::Sandbox(format!("the capture took longer than {} s", TIMEOUT.as_secs())))
        }
        code => Err(CaptureError::Script { code, output: out.stderr.trim().to_owned() }),
    }
}

/// Most bytes one scope may send: a whole diff just within the bound.
fn scope_cap(max_patch: u64) -> u64 {
    max_patch.saturating_add(MAX_SUMMARY_BYTES).saturating_add(1)
}

/// The most stdout the worker reads: the header and two scopes.
fn stdout_cap(max_patch: u64) -> usize {
    let body = scope_cap(max_patch).saturating_mul(2);
    usize::try_from(body).unwrap_or(usize::MAX).saturating_add(MAX_HEADER)
}

/// A scope's fields in the header.
#[derive(Clone, Copy)]
enum Announced {
    /// git's whole output, this long.
    Whole(u64),
    /// The patch's size (sent when within the bound), the listing's length.
    Split(u64, u64),
}

/// The script's output, checked against its header: every length within
/// its bound and the body exactly as long as announced.
fn parse_output(mut stdout: Vec<u8>, max_patch: u64, way: Way) -> Result<Taken, CaptureError> {
    let end = stdout.iter().take(MAX_HEADER).position(|b| *b == b'\n').ok_or_else(|| garbage("no header"))?;
    let header = std::str::from_utf8(&stdout[..end]).map_err(|_| garbage("the header is not text"))?;
    let fields: Vec<&str> = header.split(' ').collect();
    let ["KILN-CAPTURE", tree, index, base, r0, r1, r2, s0, s1, s2] = fields[..] else {
        return Err(garbage("a malformed header"));
    };
    if !super::base::is_object_id(tree) {
        return Err(garbage("the tree is not an object id"));
    }
    let run = announced([r0, r1, r2], max_patch)?.ok_or_else(|| garbage("no run scope"))?;
    let session = announced([s0, s1, s2], max_patch)?;
    let (tree, vouch) = (tree.to_owned(), Vouch::from_fields(index, base));
    let mut body = Body { bytes: stdout.split_off(end + 1), at: 0 };
    let run = body.scope(run, max_patch)?;
    let session = session.map(|s| body.scope(s, max_patch)).transpose()?;
    if body.at != body.bytes.len() {
        return Err(garbage("longer than announced"));
    }
    Ok(Taken { tree, run, session, vouch, way })
}

fn garbage(why: &str) -> CaptureError {
    CaptureError::Garbage(format!("the capture's output: {why}"))
}

/// One scope's three header fields; `None` for `- - -`.
fn announced(fields: [&str; 3], max_patch: u64) -> Result<Option<Announced>, CaptureError> {
    let size = |text: &str| text.parse::<u64>().map_err(|_| garbage("a malformed size"));
    let within = |n: u64, cap: u64| (n <= cap).then_some(n).ok_or_else(|| garbage("a length over its cap"));
    Ok(Some(match fields {
        ["-", "-", "-"] => return Ok(None),
        ["d", "-", n] => Announced::Whole(within(size(n)?, scope_cap(max_patch))?),
        ["s", p, n] => Announced::Split(size(p)?, within(size(n)?, MAX_SUMMARY_BYTES)?),
        _ => return Err(garbage("a malformed scope")),
    }))
}

/// The output after the header, taken in order.
struct Body {
    bytes: Vec<u8>,
    at: usize,
}

impl Body {
    fn next(&mut self, len: u64) -> Result<&[u8], CaptureError> {
        let short = || garbage("shorter than announced");
        let end = usize::try_from(len).ok().and_then(|len| self.at.checked_add(len)).ok_or_else(short)?;
        let taken = self.bytes.get(self.at..end).ok_or_else(short)?;
        self.at = end;
        Ok(taken)
    }

    /// One scope: the listing, and the patch when within `max_patch`.
    fn scope(&mut self, announced: Announced, max_patch: u64) -> Result<Scope, CaptureError> {
        match announced {
            Announced::Whole(n) => split_whole(self.next(n)?, max_patch),
            Announced::Split(patch_bytes, n) => {
                let patch = match patch_bytes <= max_patch {
                    true => Some(self.next(patch_bytes)?.to_vec()),
                    false => None,
                };
                Ok(Scope { patch_bytes, patch, summary: self.next(n)?.to_vec(), counted: None })
            }
        }
    }
}

/// git's whole output split where the listing ends: its fields are never
/// empty, so the first empty field (a NUL right after a NUL, or first) is
/// the separator, and the patch follows it. No output: no change.
fn split_whole(whole: &[u8], max_patch: u64) -> Result<Scope, CaptureError> {
    if whole.is_empty() {
        return Ok(Scope { patch_bytes: 0, patch: Some(Vec::new()), summary: Vec::new(), counted: Some(Vec::new()) });
    }
    let separator = (0..whole.len())
        .find(|&i| whole[i] == 0 && (i == 0 || whole[i - 1] == 0))
        .ok_or_else(|| garbage("no end to the listing"))?;
    let (summary, patch) = (&whole[..separator], &whole[separator + 1..]);
    let patch_bytes = patch.len() as u64;
    Ok(Scope {
        patch_bytes,
        patch: (patch_bytes <= max_patch).then(|| patch.to_vec()),
        summary: summary.to_vec(),
        counted: Some(count_patch(patch)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "0123456789abcdef0123456789abcdef01234567";

    fn output(header: &str, body: &[u8]) -> Vec<u8> {
        [format!("KILN-CAPTURE {TREE} - - {header}\n").as_bytes(), body].concat()
    }

    #[test]
    fn the_output_is_split_as_its_header_says() {
        let taken = parse_output(output("d - 17 - - -", b":x M\0a\0\0diff x\0\0y"), 10, Way::Script).unwrap();
        assert_eq!(taken.tree, TREE);
        let patch = b"diff x\0\0y".to_vec();
        let counted = Some(vec![]);
        assert_eq!(taken.run, Scope { patch_bytes: 9, patch: Some(patch), summary: b":x M\0a\0".to_vec(), counted });
        assert!(taken.session.is_none());
        assert_eq!(taken.vouch, Vouch::default());
        let hash = "0f".repeat(32);
        let vouched = format!("KILN-CAPTURE {TREE} {hash} - d - 0 - - -\n");
        assert_eq!(parse_output(vouched.into_bytes(), 10, Way::Script).unwrap().vouch.index, Some(hash));
        let both = parse_output(output("d - 0 s 20 2", b"st"), 10, Way::Script).unwrap();
        let empty = Scope { patch_bytes: 0, patch: Some(vec![]), summary: vec![], counted: Some(vec![]) };
        assert_eq!(both.run, empty);
        let session = Scope { patch_bytes: 20, patch: None, summary: b"st".to_vec(), counted: None };
        assert_eq!(both.session, Some(session));
        let split = parse_output(output("s 3 2 - - -", b"abcst"), 10, Way::Script).unwrap();
        let run = Scope { patch_bytes: 3, patch: Some(b"abc".to_vec()), summary: b"st".to_vec(), counted: None };
        assert_eq!(split.run, run);
        let over = parse_output(output("d - 12 - - -", b":x A\0a\0\0diff"), 3, Way::Script).unwrap();
        assert_eq!((over.run.patch_bytes, over.run.patch), (4, None), "a whole diff over the bound keeps no patch");
    }

    #[test]
    fn output_unlike_its_header_is_refused() {
        let huge = format!("s 3 {} - - -", MAX_SUMMARY_BYTES + 1);
        let whole = format!("d - {} - - -", scope_cap(10) + 1);
        for (header, body) in [
            ("s 3 2 - - -", &b"abcx"[..]),
            ("s 3 2 - - -", b"abcxyz"),
            ("s -3 2 - - -", b"abcxy"),
            ("s 3 2 - - 1", b"abcxy"),
            ("s 3 2", b"abcxy"),
            ("- - - - - -", b""),
            ("d - 3 - - -", b"abc"),
            ("d 1 3 - - -", b"\0\0a"),
            (huge.as_str(), b"abc"),
            (whole.as_str(), b""),
        ] {
            assert!(parse_output(output(header, body), 10, Way::Script).is_err(), "{header:?} {body:?}");
        }
        assert!(parse_output(b"KILN-CAPTURE x - - d - 0 - - -\n".to_vec(), 10, Way::Script).is_err());
        assert!(parse_output(vec![b'a'; 4096], 10, Way::Script).is_err());
        let huge = output("s 18446744073709551615 0 - - -", b"");
        assert!(parse_output(huge.clone(), u64::MAX, Way::Script).is_err(), "a patch longer than what was sent");
        assert!(
            parse_output(huge, 10, Way::Script).unwrap().run.patch.is_none(),
            "a patch over the bound is not expected"
        );
        assert_eq!(stdout_cap(u64::MAX), usize::MAX);
    }
}
