//! Who the toolbox acts as, when it is not who it runs as.
//!
//! The worker starts the toolbox as root (with only `CAP_SETUID`,
//! `CAP_SETGID` and `CAP_KILL`) and names the sandbox user with `--user`.
//! Commands then run as that user, and nothing they do can reach the
//! toolbox: another uid cannot signal it, trace it or open its
//! `/proc/<pid>/fd` (its stdout is the worker's frame stream), and
//! `PR_SET_DUMPABLE` off keeps even a same-uid process out of its `/proc`.
//!
//! The toolbox's own file work (view, write, edit, ls, …) must be the
//! user's, not root's: a symlink to a root-only file must not be readable
//! through the toolbox, and files it creates belong to the user. So before
//! any thread exists, [`assume`] sets the fs uid/gid to the user's and drops
//! every supplementary group. Threads inherit the credentials of the thread
//! that creates them, and every thread of the toolbox is created after this
//! (the request threads, the writer, the reaper), so all of them act as the
//! user on the filesystem.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::sync::OnceLock;

use rustix::process::{Gid, Uid};
use rustix::thread::CapabilitySet;

/// The sandbox user, once [`assume`] has succeeded.
static RUN_AS: OnceLock<RunAs> = OnceLock::new();

/// The user commands run as and file operations are done as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// `$HOME` for commands: the user's home in `/etc/passwd`, else `/` (as
    /// `docker exec -u` would have set it).
    pub home: OsString,
}

#[derive(Debug)]
pub struct IdentityError(String);

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityError {}

/// Resolves `spec` (`uid`, `uid:gid`, `name` or `name:group`, as Docker's
/// `--user` takes it) against the contents of `/etc/passwd` and `/etc/group`.
pub fn resolve(spec: &str, passwd: &str, group: &str) -> Result<RunAs, IdentityError> {
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() {
        return Err(IdentityError(format!("--user {spec:?} names no user")));
    }
    // name:password:uid:gid:gecos:home:shell
    let entries: Vec<Vec<&str>> =
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 7).collect();
    let entry = match user.parse::<u32>() {
        Ok(uid) => entries.iter().find(|f| f[2].parse() == Ok(uid)),
        Err(_) => entries.iter().find(|f| f[0] == user),
    };
    let uid = match (user.parse::<u32>(), entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some(f)) => parse_id(f[2], "uid")?,
        (Err(_), None) => return Err(IdentityError(format!("no user {user:?} in /etc/passwd"))),
    };
    let gid = match grp {
        Some(g) if !g.is_empty() => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .map(|f| parse_id(f[2], "gid"))
                .transpose()?
                .ok_or_else(|| IdentityError(format!("no group {g:?} in /etc/group")))?,
        },
        // The user's primary group; for a uid the image does not know,
        // Docker would use group 0, a sandbox user gets gid = uid instead.
        _ => match entry {
            Some(f) => parse_id(f[3], "gid")?,
            None => uid,
        },
    };
    let home = entry.map(|f| f[5]).filter(|h| !h.is_empty()).unwrap_or("/");
    Ok(RunAs { uid, gid, home: OsString::from(home) })
}

fn parse_id(field: &str, what: &str) -> Result<u32, IdentityError> {
    field.parse().map_err(|_| IdentityError(format!("bad {what} {field:?} in the user database")))
}

/// Becomes unreachable for other processes and acts as `user` on the
/// filesystem. Must run before the toolbox starts any thread.
///
/// Without `--user` (or when already running as that user) only the
/// dumpable flag is cleared.
pub fn assume(user: Option<RunAs>) -> Result<(), IdentityError> {
    // Not dumpable: no ptrace attach and no /proc/<pid>/fd, mem, environ for
    // anyone without CAP_SYS_PTRACE, whatever their uid.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| IdentityError(format!("cannot clear the dumpable flag: {e}")))?;
    let Some(user) = user else { return Ok(()) };
    if rustix::process::geteuid().as_raw() == user.uid {
        return Ok(());
    }
    let caps =
        rustix::thread::capabilities(None).map_err(|e| IdentityError(format!("cannot read the capabilities: {e}")))?;
    let needed = CapabilitySet::SETUID | CapabilitySet::SETGID | CapabilitySet::KILL;
    if !caps.effective.contains(needed) {
        return Err(IdentityError(format!(
            "running as uid {} without CAP_SETUID, CAP_SETGID and CAP_KILL, so commands cannot run as uid {}",
            rustix::process::geteuid().as_raw(),
            user.uid
        )));
    }
    // No supplementary groups (root's would grant their files), then the fs
    // ids: file access is checked against these, not the euid.
    rustix::thread::set_thread_groups(&[])
        .map_err(|e| IdentityError(format!("cannot drop supplementary groups: {e}")))?;
    match set_fs_ids(user.uid, user.gid) {
        Ok(()) => {}
        Err(FsIdsError::Unsupported) => set_effective_ids(user.uid, user.gid)?,
        Err(FsIdsError::Refused(e)) => return Err(e),
    }
    // Changing the euid resets the dumpable flag on some kernels: clear it
    // again, whichever switch was made.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| IdentityError(format!("cannot clear the dumpable flag: {e}")))?;
    let home = usable_home(&user);
    let _ = RUN_AS.set(RunAs { home, ..user });
    Ok(())
}

/// `HOME` when the image gives the user none it can write: a uid missing
/// from `/etc/passwd` (Docker's `--user 4242` gets `/`), or a home that is
/// not there or not the user's. On `/tmp`, which every sandbox has
/// writable (a tmpfs), so tools that keep caches and settings under `~`
/// work in any image.
pub const FALLBACK_HOME: &str = "/tmp/kiln-home";

/// The user's home if it is a directory the user can write, else
/// [`FALLBACK_HOME`], created as the user (the fs ids are the user's by
/// now). Failing that, the home as given: commands still run.
fn usable_home(user: &RunAs) -> OsString {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let writable = |m: &std::fs::Metadata| m.is_dir() && (m.uid() == user.uid || m.mode() & 0o002 != 0);
    if user.home != OsStr::new("/") && std::fs::metadata(&user.home).is_ok_and(|m| writable(&m)) {
        return user.home.clone();
    }
    let _ = std::fs::DirBuilder::new().mode(0o700).create(FALLBACK_HOME);
    // Not following a symlink: only a real directory of the user's will do.
    match std::fs::symlink_metadata(FALLBACK_HOME) {
        Ok(m) if m.is_dir() && m.uid() == user.uid => OsString::from(FALLBACK_HOME),
        _ => user.home.clone(),
    }
}

/// Why the fs ids could not be set.
enum FsIdsError {
    /// The kernel has no `setfsuid` (gVisor answers ENOSYS).
    Unsupported,
    Refused(IdentityError),
}

/// `setfsgid` then `setfsuid` for the calling thread (threads created
/// later inherit them). Both calls return the previous id and never fail
/// loudly, so each is repeated to read back what is now in force.
fn set_fs_ids(uid: u32, gid: u32) -> Result<(), FsIdsError> {
    // SAFETY: plain system calls on integer arguments; no memory is shared.
    let first = unsafe { libc::setfsgid(gid) };
    if first == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        return Err(FsIdsError::Unsupported);
    }
    // SAFETY: as above.
    let (gid_now, uid_now) = unsafe {
        let g = libc::setfsgid(gid) as u32;
        libc::setfsuid(uid);
        let u = libc::setfsuid(uid) as u32;
        (g, u)
    };
    if (uid_now, gid_now) != (uid, gid) {
        return Err(FsIdsError::Refused(IdentityError(format!(
            "cannot act as {uid}:{gid} on the filesystem (got {uid_now}:{gid_now})"
        ))));
    }
    Ok(())
}

/// Where there are no fs ids (gVisor), the effective ids do their job: the
/// kernel checks file access against the fs ids, which follow the effective
/// ones. The real and saved ids stay root's, and that is what keeps the
/// user's commands away from the toolbox: a signal needs the sender's uid to
/// match the target's real or saved uid, and ptrace and `/proc/<pid>/fd` all
/// three. Commands are started with every id the user's (see
/// [`become_user`]), which an unprivileged process may do because each new
/// id is one of its current ones. For the calling thread only (raw system
/// calls), before any other thread exists.
fn set_effective_ids(uid: u32, gid: u32) -> Result<(), IdentityError> {
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    let refused = |e| IdentityError(format!("cannot act as {uid}:{gid} (effective ids): {e}"));
    set_thread_res_gid(None, Gid::from_raw(gid), None).map_err(refused)?;
    set_thread_res_uid(None, Uid::from_raw(uid), None).map_err(refused)?;
    Ok(())
}

/// Makes the calling process `user` through and through (real, effective
/// and saved ids; the supplementary groups were dropped at start). For a
/// command's child between fork and exec: raw system calls only. Works both
/// from root (with `CAP_SETUID`/`CAP_SETGID`) and from the effective-ids
/// switch of [`set_effective_ids`].
pub fn become_user(user: &RunAs) -> std::io::Result<()> {
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    let gid = Gid::from_raw(user.gid);
    let uid = Uid::from_raw(user.uid);
    set_thread_res_gid(gid, gid, gid)?;
    set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}

/// The user commands run as, if the toolbox runs as someone else.
pub fn run_as() -> Option<&'static RunAs> {
    RUN_AS.get()
}

/// Who owns the files the toolbox creates: the sandbox user, or ourselves.
pub fn file_owner() -> (Uid, Gid) {
    match run_as() {
        Some(u) => (Uid::from_raw(u.uid), Gid::from_raw(u.gid)),
        None => (rustix::process::geteuid(), rustix::process::getegid()),
    }
}

/// `env` with `HOME` set for the sandbox user when the toolbox runs as
/// someone else (Docker set ours to root's).
pub fn command_env(mut env: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    if let Some(user) = run_as() {
        env.retain(|(k, _)| k != OsStr::new("HOME"));
        env.push((OsString::from("HOME"), user.home.clone()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nkiln:x:1000:1001::/home/kiln:/bin/bash\nbad:x\n";
    const GROUP: &str = "root:x:0:\nkiln:x:1001:\nstaff:x:50:kiln\n";

    fn run_as(uid: u32, gid: u32, home: &str) -> RunAs {
        RunAs { uid, gid, home: home.into() }
    }

    #[test]
    fn numeric_and_named_users_resolve_like_docker() {
        assert_eq!(resolve("1000:1000", PASSWD, GROUP).unwrap(), run_as(1000, 1000, "/home/kiln"));
        assert_eq!(resolve("1000", PASSWD, GROUP).unwrap(), run_as(1000, 1001, "/home/kiln"));
        assert_eq!(resolve("kiln", PASSWD, GROUP).unwrap(), run_as(1000, 1001, "/home/kiln"));
        assert_eq!(resolve("kiln:staff", PASSWD, GROUP).unwrap(), run_as(1000, 50, "/home/kiln"));
        // A uid the image does not know: home `/`, group = uid, never root's.
        assert_eq!(resolve("4242", PASSWD, GROUP).unwrap(), run_as(4242, 4242, "/"));
        assert_eq!(resolve("4242:7", "", "").unwrap(), run_as(4242, 7, "/"));
    }

    #[test]
    fn unknown_names_are_errors() {
        assert!(resolve("nobody-here", PASSWD, GROUP).is_err());
        assert!(resolve("kiln:nogroup", PASSWD, GROUP).is_err());
        assert!(resolve(":1000", PASSWD, GROUP).is_err());
    }
}
