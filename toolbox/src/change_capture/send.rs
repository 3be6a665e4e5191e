//! The capture's output on stdout, and nothing else there: `KILN-CAPTURE
//! <tree> <index sha256|-> <base index sha256|->`, the run's scope, the
//! session's (`- - -`: the run's), a newline, then what the scopes' fields
//! announce, in order. A scope is `d - <n>`: git's whole output (the `--raw
//! -z` listing, a NUL, the patch), `n` bytes; or, when that is over the
//! summary cap plus the patch bound plus one, `s <p> <n>`: the patch's size
//! `p`, the patch itself only when within the bound, then the first `n`
//! bytes of the `--raw --numstat -z` listing. The worker reads exactly what
//! the header announces, within its own bounds.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::git::Git;
use super::take::{Taken, diff_file};
use super::{CANNOT_SEND, DIFF_FAILED, Failed, Request};

/// A piece of a file sent as it is.
struct Part {
    path: PathBuf,
    offset: u64,
    len: u64,
}

/// Writes the header and the scopes' outputs to `out`.
pub fn send(
    git: &Git,
    request: &Request,
    dir: &Path,
    taken: &Taken,
    kept_base: Option<&str>,
    mut out: impl Write,
) -> Result<(), Failed> {
    let index = taken.index_hash.as_deref().unwrap_or("-");
    let mut header = format!("KILN-CAPTURE {} {index} {}", taken.tree, kept_base.unwrap_or("-"));
    let mut parts = Vec::new();
    scope(git, request, dir, "run", &request.base, &mut header, &mut parts)?;
    match request.session_base == request.base {
        true => header.push_str(" - - -"),
        false => scope(git, request, dir, "session", &request.session_base, &mut header, &mut parts)?,
    }
    let sent = (|| {
        writeln!(out, "{header}")?;
        for part in parts {
            let mut file = File::open(&part.path)?;
            file.seek(SeekFrom::Start(part.offset))?;
            let copied = std::io::copy(&mut file.take(part.len), &mut out)?;
            if copied != part.len {
                return Err(std::io::Error::other("a file of the capture changed while it was sent"));
            }
        }
        out.flush()
    })();
    sent.map_err(Failed::io(CANNOT_SEND, "sending the capture"))
}

/// One scope's header fields and the parts it sends.
fn scope(
    git: &Git,
    request: &Request,
    dir: &Path,
    name: &str,
    from: &str,
    header: &mut String,
    parts: &mut Vec<Part>,
) -> Result<(), Failed> {
    let whole = diff_file(dir, name);
    let len = size(&whole)?;
    if len <= request.summary_cap.saturating_add(request.max_patch).saturating_add(1) {
        header.push_str(&format!(" d - {len}"));
        parts.push(Part { path: whole, offset: 0, len });
        return Ok(());
    }
    // Over the bound: the patch's size, the patch when within the bound,
    // and the listing with its line counts, capped.
    let listing_end = listing_end(&whole)?;
    let patch = len - listing_end - 1;
    let list = dir.join(format!("{name}.list"));
    let file = super::create(&list).map_err(Failed::io(DIFF_FAILED, "writing the listing"))?;
    if !git.succeeds(git.diff(from, "--numstat").stdout(file))? {
        return Err(Failed::new(DIFF_FAILED, "git diff --numstat failed".into()));
    }
    let listed = size(&list)?.min(request.summary_cap);
    header.push_str(&format!(" s {patch} {listed}"));
    if patch <= request.max_patch {
        parts.push(Part { path: whole, offset: listing_end + 1, len: patch });
    }
    parts.push(Part { path: list, offset: 0, len: listed });
    Ok(())
}

fn size(path: &Path) -> Result<u64, Failed> {
    Ok(std::fs::metadata(path).map_err(Failed::io(CANNOT_SEND, "reading a diff's size"))?.len())
}

/// Where the `--raw -z` listing of a whole diff ends: its fields are never
/// empty, so the first empty field (a NUL first, or right after a NUL) is
/// the separator the patch follows.
fn listing_end(path: &Path) -> Result<u64, Failed> {
    let file = File::open(path).map_err(Failed::io(CANNOT_SEND, "reading a diff"))?;
    let mut previous = 1u8;
    for (at, byte) in BufReader::with_capacity(1 << 16, file).bytes().enumerate() {
        let byte = byte.map_err(Failed::io(CANNOT_SEND, "reading a diff"))?;
        if byte == 0 && (at == 0 || previous == 0) {
            return Ok(at as u64);
        }
        previous = byte;
    }
    Err(Failed::new(CANNOT_SEND, "the diff's listing has no end".into()))
}
