//! The index the capture starts from.
//!
//! `git add -A` hashes only the files whose stat data differ from the index
//! it starts from, so the capture's index is seeded with a stat cache when
//! one is at hand, made to track exactly what an empty index given the base
//! would track (`read-tree -i -m <base>`: an entry keeps its stat data only
//! where its blob is the base's). That read-tree reads the whole index and
//! the base's trees and writes the index again, so it is skipped when the
//! seed's entries already are the base's: the capture's own index from the
//! session's last capture when that capture's tree is this run's base (a
//! follow-up run: `index.tree` names it), or the index as the last
//! read-tree onto this same base left it (`base`, a hard link that git's next
//! write of the index leaves alone; `base.tree` names its base). Else it
//! seeds from the capture's own index, then from a copy of the repository's
//! `.git/index` (timestamps kept, so git's racy-entry check still holds),
//! and runs the read-tree.
//!
//! These files are the sandbox's (hostile): what a forged one can do is what
//! a forged stat cache can (make `add -A` take an entry's stat data on
//! trust), nothing more, as long as no entry is marked assume-unchanged or
//! skip-worktree (which would hide a change from `add -A`). So a seed that
//! is not a plain file or is over 64 MiB is not taken, and the entries'
//! flags are checked beside the diff (the capture is taken again from the
//! empty index given the base when any is flagged) — unless the worker
//! vouches for the seed: its whole content hashes (SHA-256) to an index a
//! capture of this session wrote, as the capture reported it. Not git's own
//! trailing checksum: git does not verify it when it reads an index, so an
//! edited index can keep its old one.

use std::fs::{File, FileTimes};
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::git::Git;
use super::{CANNOT_SEND, Failed, NO_BASE, NO_GIT_DIR, Paths, Request, remove_any};

/// Largest seed index taken.
const MAX_SEED: u64 = 64 * 1024 * 1024;
/// Longest line read from the files naming a tree.
const MAX_TREE_LINE: u64 = 128;

/// How the capture starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From a seed the worker vouches for: no flag check.
    Vouched,
    /// From a seed whose flags are checked beside the diff.
    Check,
    /// From the empty index given the base.
    Empty,
}

/// What becomes of the vouch for the base's index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BaseIndex {
    /// Untouched: the worker's vouch stands as it was.
    AsVouched(Option<String>),
    /// Written by this capture's read-tree: hashed afresh.
    Rewritten,
    /// Removed.
    Gone,
}

/// The capture's kept files and what the worker said of them.
pub struct Seeds {
    index: PathBuf,
    base: PathBuf,
    index_tree_file: PathBuf,
    base_tree_file: PathBuf,
    workspace_index: PathBuf,
    /// The tree the last capture wrote (its index is `index`'s content).
    index_tree: String,
    /// The base `base` is the index of.
    base_tree: String,
    request: Request,
    base_index: BaseIndex,
}

impl Seeds {
    /// Reads what the last capture left and forgets which tree the index is
    /// of (until this capture records its own).
    pub fn read(paths: &Paths, request: &Request) -> Result<Seeds, Failed> {
        let keep = &paths.keep;
        let seeds = Seeds {
            index: keep.join("index"),
            base: keep.join("base"),
            index_tree_file: keep.join("index.tree"),
            base_tree_file: keep.join("base.tree"),
            workspace_index: paths.workspace.join(".git/index"),
            index_tree: first_line(&keep.join("index.tree")),
            base_tree: first_line(&keep.join("base.tree")),
            request: request.clone(),
            base_index: BaseIndex::AsVouched(request.vouch_base.clone()),
        };
        write_new(&seeds.index_tree_file, b"").map_err(Failed::io(NO_GIT_DIR, "clearing index.tree"))?;
        Ok(seeds)
    }

    /// Puts the seed in place and says how the capture starts from it.
    pub fn choose(&mut self, git: &Git) -> Result<Start, Failed> {
        let base = self.request.base.clone();
        if self.index_tree == base
            && let Some(start) = takeable(&self.index, self.request.vouch_index.as_deref())
        {
            return Ok(start);
        }
        if self.base_tree == base {
            let vouch = match &self.base_index {
                BaseIndex::AsVouched(vouch) => vouch.clone(),
                _ => None,
            };
            if let Some(start) = takeable(&self.base, vouch.as_deref())
                && link(&self.base, &self.index).is_ok()
            {
                return Ok(start);
            }
        }
        if let Some(start) = self.seed(git, &self.index.clone())? {
            return Ok(start);
        }
        let _ = remove_any(&self.index);
        Ok(self.seed(git, &self.workspace_index.clone())?.unwrap_or(Start::Empty))
    }

    /// `from` as the index, read onto the base (and kept as the base's
    /// index for the next capture on this base); `None` when it cannot be.
    fn seed(&mut self, git: &Git, from: &Path) -> Result<Option<Start>, Failed> {
        let Some(start) = takeable(from, self.request.vouch_index.as_deref()) else { return Ok(None) };
        if from != self.index && copy_with_times(from, &self.index).is_err() {
            return Ok(None);
        }
        if !git.succeeds(&mut git.command(["read-tree", "-i", "-m", &self.request.base]))? {
            return Ok(None);
        }
        // Bookkeeping: without it the next capture reads the tree again.
        let kept = write_new(&self.base_tree_file, b"")
            .and_then(|()| link(&self.index, &self.base))
            .and_then(|()| write_new(&self.base_tree_file, format!("{}\n", self.request.base).as_bytes()));
        self.base_index = if kept.is_ok() { BaseIndex::Rewritten } else { BaseIndex::Gone };
        Ok(Some(start))
    }

    /// The empty index given the base: the slow path, always right.
    pub fn empty(&mut self, git: &Git) -> Result<(), Failed> {
        for file in [&self.index, &self.base, &self.base_tree_file] {
            let _ = remove_any(file);
        }
        self.base_index = BaseIndex::Gone;
        match git.succeeds(&mut git.command(["read-tree", &self.request.base]))? {
            true => Ok(()),
            false => Err(Failed::new(NO_BASE, format!("reading the base {} failed", self.request.base))),
        }
    }

    /// The SHA-256 of the base's index as this capture leaves it, for the
    /// worker to vouch for; `None`: nothing to vouch for.
    pub fn base_vouch(&self) -> Option<String> {
        match &self.base_index {
            BaseIndex::AsVouched(vouch) => vouch.clone(),
            BaseIndex::Rewritten => sha256_of(&self.base),
            BaseIndex::Gone => None,
        }
    }

    /// Records that the index is of `tree`.
    pub fn record_tree(&self, tree: &str) -> Result<(), Failed> {
        write_new(&self.index_tree_file, format!("{tree}\n").as_bytes())
            .map_err(Failed::io(CANNOT_SEND, "recording the tree"))
    }
}

/// Whether the seed at `path` may be taken, and how: vouched for when its
/// content hashes to `vouch`, else checked, when it is a plain file within
/// [`MAX_SEED`].
fn takeable(path: &Path, vouch: Option<&str>) -> Option<Start> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_SEED {
        return None;
    }
    match vouch {
        Some(vouch) if sha256_of(path).as_deref() == Some(vouch) => Some(Start::Vouched),
        _ => Some(Start::Check),
    }
}

/// The SHA-256 of the file at `path` (read without following a link), in
/// hex; `None` when it does not read.
pub fn sha256_of(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut file = File::open(path).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 16];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `text` is lowercase hex of one of `lengths`.
pub fn is_hex(text: &str, lengths: &[usize]) -> bool {
    lengths.contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The first line of a small file; empty when there is none.
fn first_line(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(file) = File::open(path) {
        let _ = file.take(MAX_TREE_LINE).read_to_string(&mut text);
    }
    text.lines().next().unwrap_or_default().to_owned()
}

/// `to` becomes a hard link to `from`, replacing what was there in one
/// rename (git's next write of either replaces that file, not the shared
/// content).
fn link(from: &Path, to: &Path) -> std::io::Result<()> {
    let staged = to.with_extension("link");
    let _ = remove_any(&staged);
    std::fs::hard_link(from, &staged)?;
    std::fs::rename(&staged, to)
}

/// A copy of `from` at `to` with `from`'s modification and access times:
/// git compares its entries' times with the index's own to tell which
/// entries were written too close to the index to trust.
fn copy_with_times(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = std::fs::metadata(from)?;
    remove_any(to)?;
    std::fs::copy(from, to)?;
    let times = FileTimes::new().set_accessed(meta.accessed()?).set_modified(meta.modified()?);
    File::options().write(true).open(to)?.set_times(times)
}

/// Writes `bytes` to a new file at `path` (not through a link there).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    super::create(path)?.write_all(bytes)
}
