//! `kiln-toolbox capture`: a run's change, taken inside the sandbox at the
//! run's end and sent on stdout, framed as the worker reads it
//! (`worker/src/capture/script.rs` says the format, and runs the same steps
//! as a shell script where a sandbox has no toolbox of the worker's).
//!
//! One process that runs git three times (`add -A`, then `write-tree` and
//! one diff per scope side by side) and does everything else itself: the
//! shell script it replaces started a dozen small processes (`rm`, `ln`,
//! `stat`, `cat`, two `sha256sum`) around the same git commands, each a few
//! milliseconds on a loaded machine (issue 28's capture figure).
//!
//! git has a git directory of its own (`/tmp/kiln-capture/git`, its
//! configuration written afresh and its `info/` removed at every capture:
//! the agent can write there between runs) that reads the repository's
//! objects through `alternates`, so nothing of the repository's own
//! configuration (hooks, `core.fsmonitor`, filter and diff drivers) runs.
//! The index it starts from is chosen by [`seed`]; everything the sandbox
//! left there is hostile and is checked before git takes it.

pub mod call;
mod git;
mod seed;
mod send;
mod take;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use self::git::Git;
use self::seed::{Seeds, Start};

/// Exit statuses, as the shell script has them: the worker reports them.
const CANNOT_WRITE: u8 = 10;
const NO_GIT_DIR: u8 = 11;
const NO_BASE: u8 = 12;
const ADD_FAILED: u8 = 13;
const NO_TREE: u8 = 14;
const DIFF_FAILED: u8 = 15;
const CANNOT_SEND: u8 = 16;

/// How much of git's complaints a failed capture repeats.
const ERR_TAIL: u64 = 2000;

/// A capture that failed: its exit status and why.
#[derive(Debug)]
pub struct Failed {
    code: u8,
    why: String,
}

impl Failed {
    fn new(code: u8, why: String) -> Failed {
        Failed { code, why }
    }

    /// `Err` mapping: an I/O error while `doing`, as the status `code`.
    fn io(code: u8, doing: &'static str) -> impl FnOnce(std::io::Error) -> Failed {
        move |e| Failed::new(code, format!("{doing}: {e}"))
    }
}

/// Whether `text` is a git object id as the capture's request and output
/// carry them: SHA-1 or SHA-256, lowercase hex (the worker checks the same).
pub fn is_object_id(text: &str) -> bool {
    seed::is_hex(text, &[40, 64])
}

/// Whether `text` is a SHA-256 in lowercase hex: what a vouch is.
pub fn is_sha256(text: &str) -> bool {
    seed::is_hex(text, &[64])
}

/// What the worker asks for: the ids the run's and the session's changes
/// are taken from, the bounds, and what it vouches for ([`seed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub base: String,
    pub session_base: String,
    /// Most bytes of a listing sent on its own (a patch over the bound).
    pub summary_cap: u64,
    pub max_patch: u64,
    pub vouch_index: Option<String>,
    pub vouch_base: Option<String>,
}

impl Request {
    /// `BASE SESSION_BASE SUMMARY_CAP MAX_PATCH VOUCH_INDEX VOUCH_BASE`,
    /// the vouches `-` for none.
    pub fn parse(args: &[String]) -> Result<Request, String> {
        let [base, session_base, cap, max_patch, index, kept_base] = args else {
            return Err(
                "usage: kiln-toolbox capture BASE SESSION_BASE SUMMARY_CAP MAX_PATCH VOUCH_INDEX VOUCH_BASE".into()
            );
        };
        let object = |id: &String| is_object_id(id).then(|| id.clone()).ok_or(format!("{id:?} is not an object id"));
        let size = |n: &String| n.parse::<u64>().map_err(|_| format!("{n:?} is not a size"));
        let vouch = |h: &String| is_sha256(h).then(|| h.clone());
        Ok(Request {
            base: object(base)?,
            session_base: object(session_base)?,
            summary_cap: size(cap)?,
            max_patch: size(max_patch)?,
            vouch_index: vouch(index),
            vouch_base: vouch(kept_base),
        })
    }
}

/// Where the capture works: the workspace, and the directory it keeps its
/// own git directory, indexes and output in between a session's captures.
#[derive(Debug, Clone)]
pub struct Paths {
    pub keep: PathBuf,
    pub workspace: PathBuf,
}

impl Paths {
    pub fn in_sandbox() -> Paths {
        Paths { keep: PathBuf::from("/tmp/kiln-capture"), workspace: PathBuf::from("/workspace") }
    }

    fn out(&self) -> PathBuf {
        self.keep.join("out")
    }

    fn git_dir(&self) -> PathBuf {
        self.keep.join("git")
    }
}

/// The subcommand: runs the capture, its output on stdout; on failure,
/// git's last words and why on stderr, and the status.
pub fn main(args: &[String]) -> ExitCode {
    let request = match Request::parse(args) {
        Ok(request) => request,
        Err(e) => {
            eprintln!("kiln-toolbox capture: {e}");
            return ExitCode::from(2);
        }
    };
    let paths = Paths::in_sandbox();
    let stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    match run(&paths, &request, stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failed) => {
            let tail = err_tail(&paths.out().join("err"));
            eprintln!("{tail}kiln-toolbox capture: {}", failed.why);
            ExitCode::from(failed.code)
        }
    }
}

/// The capture: the index to start from, git's work, what it leaves for
/// the next capture, and the output.
pub fn run(paths: &Paths, request: &Request, out: impl Write) -> Result<(), Failed> {
    let err = prepare(paths)?;
    let git = Git::new(paths.git_dir(), paths.workspace.clone(), paths.keep.join("index"), err);
    let out_dir = paths.out();
    let mut seeds = Seeds::read(paths, request)?;
    // A seed whose flags turn out set, like no seed at all, has the change
    // taken from the empty index given the base.
    let first = match seeds.choose(&git)? {
        Start::Empty => None,
        start => Some(take::take(&git, request, &out_dir, start == Start::Check)?),
    };
    let taken = match first {
        Some(taken) if !taken.flagged => taken,
        _ => {
            seeds.empty(&git)?;
            take::take(&git, request, &out_dir, false)?
        }
    };
    let kept_base = seeds.base_vouch();
    seeds.record_tree(&taken.tree)?;
    send::send(&git, request, &out_dir, &taken, kept_base.as_deref(), out)
}

/// The capture's directories as git needs them, whatever the agent left
/// there (a symbolic link in place of one, a configuration of its own);
/// the file git's complaints go to.
fn prepare(paths: &Paths) -> Result<File, Failed> {
    let out = paths.out();
    let made = (|| {
        for dir in [&paths.keep, &out] {
            if !is_real_dir(dir) {
                remove_any(dir)?;
            }
        }
        std::fs::create_dir_all(&out)?;
        create(&out.join("err"))
    })();
    let err = made.map_err(Failed::io(CANNOT_WRITE, "cannot write the capture's directory"))?;
    prepare_git_dir(paths, &err)?;
    Ok(err)
}

/// The capture's own bare repository: made once, its configuration and
/// `info/` replaced each time, its objects read through `alternates` from
/// the workspace's repository when there is one.
fn prepare_git_dir(paths: &Paths, err: &File) -> Result<(), Failed> {
    let dir = paths.git_dir();
    let failed = || Failed::io(NO_GIT_DIR, "preparing the capture's git directory");
    if !is_real_dir(&dir) {
        remove_any(&dir).map_err(failed())?;
    }
    if !dir.join("HEAD").is_file() {
        let init = Git::new(dir.clone(), paths.workspace.clone(), PathBuf::new(), err.try_clone().map_err(failed())?);
        if !init.init()? {
            return Err(Failed::new(NO_GIT_DIR, "git init of the capture's git directory failed".into()));
        }
    }
    let written = (|| {
        for planted in ["config", "info", "commondir", "objects/info/alternates"] {
            remove_any(&dir.join(planted))?;
        }
        std::fs::create_dir_all(dir.join("objects/info"))?;
        create(&dir.join("config"))?.write_all(b"[core]\n\trepositoryformatversion = 0\n\tbare = true\n")?;
        let objects = paths.workspace.join(".git/objects");
        let mut alternates = create(&dir.join("objects/info/alternates"))?;
        if objects.is_dir() {
            writeln!(alternates, "{}", objects.display())?;
        }
        Ok(())
    })();
    written.map_err(failed())
}

/// A new file at `path`, never through a link the sandbox left there.
fn create(path: &Path) -> std::io::Result<File> {
    remove_any(path)?;
    OpenOptions::new().write(true).create_new(true).open(path)
}

fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Removes whatever is at `path` (a link itself, not what it names);
/// nothing there is fine.
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The last [`ERR_TAIL`] bytes git wrote to `path`.
fn err_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else { return String::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut tail = Vec::new();
    if file.seek(SeekFrom::Start(len.saturating_sub(ERR_TAIL))).is_ok() {
        let _ = file.take(ERR_TAIL).read_to_end(&mut tail);
    }
    String::from_utf8_lossy(&tail).into_owned()
}
