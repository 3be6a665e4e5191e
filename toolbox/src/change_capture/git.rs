//! git as the capture runs it: its own git directory, the workspace as the
//! work tree, nothing of the repository's or the system's configuration,
//! and the options that neutralise what a configuration could switch on
//! given on the command line.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Failed;

/// Exit status when the image has no git.
pub const NO_GIT: u8 = 3;

/// The `-c` options every git command of the capture gets: a configuration
/// planted anywhere git might still look cannot switch on hooks, a file
/// system monitor, an untracked cache, a split index (the worker vouches
/// for the whole index file, so no part of it may live elsewhere),
/// assume-unchanged marking, a sparse checkout or a diff setting that
/// changes the patch's shape.
const OPTIONS: [&str; 16] = [
    "core.bare=false",
    "safe.directory=*",
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.ignoreStat=false",
    "core.sparseCheckout=false",
    "core.autocrlf=false",
    "core.symlinks=true",
    "core.fileMode=true",
    "core.quotePath=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.renames=true",
];

/// What git is told about its environment, whatever the sandbox set.
const ENVIRONMENT: [(&str, &str); 9] = [
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("HOME", "/nonexistent"),
    ("XDG_CONFIG_HOME", "/nonexistent"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_PAGER", "cat"),
    ("LC_ALL", "C"),
];

/// git, pointed at the capture's own git directory and index.
pub struct Git {
    git_dir: PathBuf,
    work_tree: PathBuf,
    index: PathBuf,
    /// Where git's complaints go; its tail is what a failed capture says.
    err: File,
}

impl Git {
    pub fn new(git_dir: PathBuf, work_tree: PathBuf, index: PathBuf, err: File) -> Git {
        Git { git_dir, work_tree, index, err }
    }

    pub fn index(&self) -> &Path {
        &self.index
    }

    /// A git command with nothing of the sandbox's `GIT_*` environment
    /// (which could name another git directory, index, object store or
    /// configuration) and stdin closed.
    fn bare_command(&self) -> Command {
        let mut command = Command::new("git");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("GIT_") {
                command.env_remove(name);
            }
        }
        command.envs(ENVIRONMENT).stdin(Stdio::null()).stdout(Stdio::null());
        if let Ok(err) = self.err.try_clone() {
            command.stderr(err);
        }
        command
    }

    /// `git <args>` on the capture's repository.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = self.bare_command();
        command.arg("--git-dir").arg(&self.git_dir).arg("--work-tree").arg(&self.work_tree);
        for option in OPTIONS {
            command.arg("-c").arg(option);
        }
        command.arg("-c").arg(format!("core.excludesFile={}", self.work_tree.join(".git/info/exclude").display()));
        command.env("GIT_INDEX_FILE", &self.index).args(args);
        command
    }

    /// `git diff --cached` of the index against `from`, as the worker reads
    /// it: `--raw -z` (the listing) and what `extra` adds, with renames
    /// found, full object ids, no external diff or text conversion.
    pub fn diff(&self, from: &str, extra: &str) -> Command {
        let options = ["diff", "--cached", "--no-ext-diff", "--no-textconv", "--no-color", "--full-index", "-M"];
        let mut command = self.command(options);
        command.args(["--raw", "-z", extra, from]);
        command
    }

    /// Runs `command` to its end; whether it succeeded. A git that cannot be
    /// started at all is the image's lack, said as such.
    pub fn succeeds(&self, command: &mut Command) -> Result<bool, Failed> {
        Ok(spawn(command)?.wait().map_err(|e| Failed::new(NO_GIT, format!("waiting for git: {e}")))?.success())
    }

    /// `git init --bare` of the capture's own git directory.
    pub fn init(&self) -> Result<bool, Failed> {
        let mut command = self.bare_command();
        command.args(["init", "-q", "--bare", "--template="]).arg(&self.git_dir);
        self.succeeds(&mut command)
    }
}

/// Starts `command`: no git in the image is [`NO_GIT`].
pub fn spawn(command: &mut Command) -> Result<Child, Failed> {
    command.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Failed::new(NO_GIT, "no git in the sandbox image".into()),
        _ => Failed::new(NO_GIT, format!("starting git: {e}")),
    })
}
