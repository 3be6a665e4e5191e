//! The capture inside the sandbox: one exec of a script that runs git on
//! the workspace with a store of its own and sends everything back on that
//! exec's own stdout, framed and bounded. Nothing runs git on the worker's
//! side over the sandbox's files.
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
//! Per scope, git diffs twice, in parallel: the patch, and one `--raw
//! --numstat -z` listing that gives the summary (status, paths, counts).
//!
//! The read back: the script writes its outputs to files first (so it
//! knows their sizes), then prints one header line and the outputs
//! themselves on stdout, a patch only when it is within the bound. The
//! worker reads at most what the bound allows ([`stdout_cap`]) and accepts
//! only output whose length is exactly what the header announced.

use std::time::Duration;

use super::CaptureError;

/// Longest the capture may take in the sandbox.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Most bytes of each scope's `-z` summary kept in the sandbox and sent.
const MAX_SUMMARY_BYTES: u64 = 8 * 1024 * 1024;
/// Longest header line accepted.
const MAX_HEADER: usize = 512;
/// Exit statuses of GNU `timeout` when it stopped the script.
const TIMED_OUT: [i64; 2] = [124, 137];

/// `$1`: what the run's change is diffed from, `$2`: the session's;
/// `$3`: the summaries' cap; `$4`: the patches' bound. On stdout, and
/// nothing else there: `KILN-CAPTURE <tree> <run patch bytes> <run summary
/// bytes> <session patch bytes or -> <session summary bytes or ->`, a
/// newline, then the run's patch (when within `$4`), its summary, the
/// session's patch (when within `$4`) and its summary. On failure, git's
/// last words on stderr.
const SCRIPT: &str = r#"set -u
B=$1 S=$2 CAP=$3 MAXP=$4 K=/tmp/kiln-capture
O=$K/out
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES \
  GIT_EXTERNAL_DIFF GIT_DIFF_OPTS GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_NAMESPACE
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent XDG_CONFIG_HOME=/nonexistent \
  GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 GIT_ATTR_NOSYSTEM=1 GIT_PAGER=cat LC_ALL=C
[ -L "$K" ] && rm -f "$K"
rm -rf "$O" && mkdir -p "$O" || { echo "cannot write $O" >&2; exit 10; }
exec 3>&1 4>&2 >"$O/err" 2>&1
fail() { tail -c 2000 "$O/err" >&4; exit "$1"; }
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
  d --raw --numstat -z "$1" | head -c "$CAP" > "$O/$2.summary" &
  wait "$P" || fail 15
}
scope "$B" run
[ "$S" != "$B" ] && scope "$S" session
wait "$W" && T=$(cat "$O/tree") || fail 14
wait
mv -f "$GIT_INDEX_FILE" "$K/index"
size() { if [ -f "$O/$1" ]; then stat -c %s "$O/$1"; else echo -; fi; }
RP=$(size run.patch) RS=$(size run.summary) SP=$(size session.patch) SS=$(size session.summary)
send() { [ "$1" = - ] || [ "$1" -gt "$3" ] || head -c "$1" "$O/$2"; }
{ printf 'KILN-CAPTURE %s %s %s %s %s\n' "$T" "$RP" "$RS" "$SP" "$SS"
  send "$RP" run.patch "$MAXP" && send "$RS" run.summary "$CAP" &&
  send "$SP" session.patch "$MAXP" && send "$SS" session.summary "$CAP"
} >&3 || fail 16
"#;

/// One scope's change as the script sent it.
#[derive(Debug, PartialEq, Eq)]
pub struct Scope {
    pub patch_bytes: u64,
    /// `None`: over the bound, not sent.
    pub patch: Option<Vec<u8>>,
    /// git's `--raw --numstat -z` listing.
    pub summary: Vec<u8>,
}

/// What the script sent.
#[derive(Debug)]
pub struct Taken {
    /// The tree the workspace was captured at.
    pub tree: String,
    pub run: Scope,
    /// `None`: the session's change is the run's.
    pub session: Option<Scope>,
}

/// Runs the script and reads what it sends. `base` and `session_base`
/// must be object ids.
pub async fn take(
    sandbox: &crate::sandbox::Sandbox,
    base: &str,
    session_base: &str,
    max_patch: u64,
) -> Result<Taken, CaptureError> {
    if ![base, session_base].iter().all(|id| super::base::is_object_id(id)) {
        return Err(CaptureError::Garbage(format!("recorded bases {base:?}, {session_base:?} are not object ids")));
    }
    let command = format!("set -- {base} {session_base} {MAX_SUMMARY_BYTES} {max_patch}\n{SCRIPT}");
    let out = sandbox
        .exec_raw(&["bash", "-c", &command], None, stdout_cap(max_patch), TIMEOUT)
        .await
        .map_err(|e| CaptureError::Sandbox(e.to_string()))?;
    if out.overflow {
        return Err(CaptureError::Garbage("the capture sent more than its bound".into()));
    }
    match out.exit_code {
        Some(0) => parse_output(out.stdout, max_patch),
        Some(code) if TIMED_OUT.contains(&code) => {
            Err(CaptureError::Sandbox(format!("the capture took longer than {} s", TIMEOUT.as_secs())))
        }
        code => Err(CaptureError::Script { code, output: out.stderr.trim().to_owned() }),
    }
}

/// The most stdout the worker reads: the header, two patches within the
/// bound and two summaries.
fn stdout_cap(max_patch: u64) -> usize {
    let body = max_patch.saturating_add(MAX_SUMMARY_BYTES).saturating_mul(2);
    usize::try_from(body).unwrap_or(usize::MAX).saturating_add(MAX_HEADER)
}

/// The script's output, checked against its header: every length within
/// its bound and the body exactly as long as announced.
fn parse_output(mut stdout: Vec<u8>, max_patch: u64) -> Result<Taken, CaptureError> {
    let garbage = |why: &str| CaptureError::Garbage(format!("the capture's output: {why}"));
    let end = stdout.iter().take(MAX_HEADER).position(|b| *b == b'\n').ok_or_else(|| garbage("no header"))?;
    let header = std::str::from_utf8(&stdout[..end]).map_err(|_| garbage("the header is not text"))?;
    let fields: Vec<&str> = header.split(' ').collect();
    let ["KILN-CAPTURE", tree, run_patch, run_summary, session_patch, session_summary] = fields[..] else {
        return Err(garbage("a malformed header"));
    };
    if !super::base::is_object_id(tree) {
        return Err(garbage("the tree is not an object id"));
    }
    let size = |text: &str| text.parse::<u64>().map_err(|_| garbage("a malformed size"));
    let summary = |text: &str| {
        size(text).and_then(|n| (n <= MAX_SUMMARY_BYTES).then_some(n).ok_or_else(|| garbage("a summary over its cap")))
    };
    let run = (size(run_patch)?, summary(run_summary)?);
    let session = match (session_patch, session_summary) {
        ("-", "-") => None,
        (patch, summary_bytes) => Some((size(patch)?, summary(summary_bytes)?)),
    };
    let tree = tree.to_owned();
    let mut body = Body { bytes: stdout.split_off(end + 1), at: 0 };
    let run = body.scope(run, max_patch).ok_or_else(|| garbage("shorter than announced"))?;
    let session = match session {
        Some(sizes) => Some(body.scope(sizes, max_patch).ok_or_else(|| garbage("shorter than announced"))?),
        None => None,
    };
    if body.at != body.bytes.len() {
        return Err(garbage("longer than announced"));
    }
    Ok(Taken { tree, run, session })
}

/// The output after the header, taken in order.
struct Body {
    bytes: Vec<u8>,
    at: usize,
}

impl Body {
    fn next(&mut self, len: u64) -> Option<Vec<u8>> {
        let end = self.at.checked_add(usize::try_from(len).ok()?)?;
        let taken = self.bytes.get(self.at..end)?.to_vec();
        self.at = end;
        Some(taken)
    }

    /// One scope: its patch (sent only within `max_patch`), its summary.
    fn scope(&mut self, (patch_bytes, summary_bytes): (u64, u64), max_patch: u64) -> Option<Scope> {
        let patch = match patch_bytes <= max_patch {
            true => Some(self.next(patch_bytes)?),
            false => None,
        };
        Some(Scope { patch_bytes, patch, summary: self.next(summary_bytes)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "0123456789abcdef0123456789abcdef01234567";

    fn output(header: &str, body: &[u8]) -> Vec<u8> {
        [format!("KILN-CAPTURE {TREE} {header}\n").as_bytes(), body].concat()
    }

    #[test]
    fn the_output_is_split_as_its_header_says() {
        let taken = parse_output(output("3 2 - -", b"abcxy"), 10).unwrap();
        assert_eq!(taken.tree, TREE);
        assert_eq!(taken.run, Scope { patch_bytes: 3, patch: Some(b"abc".to_vec()), summary: b"xy".to_vec() });
        assert!(taken.session.is_none());
        let both = parse_output(output("3 1 20 2", b"abcxst"), 10).unwrap();
        assert_eq!(both.session, Some(Scope { patch_bytes: 20, patch: None, summary: b"st".to_vec() }));
    }

    #[test]
    fn output_unlike_its_header_is_refused() {
        let huge = format!("3 {} - -", MAX_SUMMARY_BYTES + 1);
        for (header, body) in [
            ("3 2 - -", &b"abcx"[..]),
            ("3 2 - -", b"abcxyz"),
            ("-3 2 - -", b"abcxy"),
            ("3 2 - 1", b"abcxy"),
            ("3 2", b"abcxy"),
            (huge.as_str(), b"abc"),
            ("18446744073709551615 0 - -", b""),
        ] {
            assert!(parse_output(output(header, body), u64::MAX).is_err(), "{header:?} {body:?}");
        }
        assert!(parse_output(b"KILN-CAPTURE x 1 1 - -\nab".to_vec(), 10).is_err());
        assert!(parse_output(vec![b'a'; 4096], 10).is_err());
    }
}
