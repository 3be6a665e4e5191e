//! What one command hands to the next: the working directory and the
//! exported environment, read back from the state file the preamble's EXIT
//! trap writes (see [`super::shell`]), plus the files still to be removed.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::export_list;
use super::shell::USER_BASH_ENV_VAR;
use crate::protocol::{ErrorKind, ToolError};

pub(super) struct SessionState {
    pub(super) cwd: PathBuf,
    /// Where the toolbox started; the fallback when `cwd` disappears.
    pub(super) start_dir: PathBuf,
    pub(super) env: Vec<(OsString, OsString)>,
    /// Numbers the state and command files, so no shell reuses another's.
    pub(super) seq: u64,
    /// State and command files of finished commands, not yet removed.
    pub(super) leftovers: Vec<PathBuf>,
}

impl SessionState {
    pub(super) fn new(start_dir: PathBuf, env: Vec<(OsString, OsString)>) -> Self {
        SessionState { cwd: start_dir.clone(), start_dir, env, seq: 0, leftovers: Vec::new() }
    }

    /// Where a command runs: `dir` (relative to the session's directory), or
    /// the session's directory, or, when that has disappeared, where the
    /// toolbox started, with a note for the model saying so.
    pub(super) fn resolve_cwd(&self, dir: Option<&str>) -> Result<(PathBuf, Option<String>), ToolError> {
        match dir {
            Some(dir) => {
                let p = self.cwd.join(dir);
                if !p.is_dir() {
                    return Err(ToolError::new(ErrorKind::NotFound, format!("cwd {} is not a directory", p.display())));
                }
                Ok((p, None))
            }
            None if self.cwd.is_dir() => Ok((self.cwd.clone(), None)),
            None => {
                let note = format!(
                    "the working directory {} no longer exists; the command ran in {}",
                    self.cwd.display(),
                    self.start_dir.display()
                );
                Ok((self.start_dir.clone(), Some(note)))
            }
        }
    }

    /// Reads what the EXIT trap recorded: `$PWD` and a NUL, then what `export
    /// -p` printed. A missing or empty file (the command `exec`ed another
    /// program, or replaced the trap) keeps the old state.
    pub(super) fn apply_state_file(&mut self, file: &Path, extra: &[(String, String)]) {
        let Ok(bytes) = std::fs::read(file) else { return };
        let Some(nul) = bytes.iter().position(|&b| b == 0) else { return };
        let (pwd, exports) = (&bytes[..nul], &bytes[nul + 1..]);
        if pwd.is_empty() {
            return;
        }
        let pwd = PathBuf::from(OsStr::from_bytes(pwd));
        if pwd.is_dir() {
            self.cwd = pwd;
        }
        let mut env: Vec<(OsString, OsString)> = export_list::parse(exports);
        // SHLVL would grow by one each call; `_` is bash's last argument.
        env.retain(|(k, _)| {
            let k = k.as_bytes();
            k != b"SHLVL" && k != b"_" && !k.starts_with(b"KILN_TOOLBOX_")
        });
        // A per-call variable the command left as it was given is not persisted:
        // the session goes back to its previous value (or to not having it).
        for (k, v) in extra {
            let k = OsStr::new(k);
            if let Some(pos) = env.iter().position(|(ek, ev)| ek == k && ev == OsStr::new(v)) {
                match self.env.iter().find(|(ok, _)| ok == k) {
                    Some((_, old)) => env[pos].1 = old.clone(),
                    None => {
                        env.remove(pos);
                    }
                }
            }
        }
        if let Some(shlvl) = self.env.iter().find(|(k, _)| k == "SHLVL") {
            env.push(shlvl.clone());
        }
        self.env = env;
    }
}

/// The session environment with this call's extra variables on top. A user
/// `BASH_ENV` is passed aside: ours must run first, and restores it.
pub(super) fn command_env(session: &[(OsString, OsString)], extra: &[(String, String)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = session.to_vec();
    for (k, v) in extra {
        match env.iter_mut().find(|(ek, _)| ek == OsStr::new(k)) {
            Some(slot) => slot.1 = v.into(),
            None => env.push((k.into(), v.into())),
        }
    }
    for (k, _) in env.iter_mut() {
        if k == "BASH_ENV" {
            *k = USER_BASH_ENV_VAR.into();
        }
    }
    env
}

#[cfg(test)]
#[path = "session_state_tests.rs"]
mod tests;
