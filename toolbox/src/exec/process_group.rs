//! Killing and reaping what a command started.
//!
//! Each command's shell leads a process group of its own, so a timeout or a
//! cancel kills the whole group at once, background children included. The
//! toolbox is the sandbox's child subreaper (see `main.rs`): children whose
//! shell has exited are reparented to it, and reaping them here is how it
//! knows a killed group is really gone and keeps zombies from piling up.

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

/// After killing a process group, how long we wait for all of it to be gone.
const REAP_LIMIT: Duration = Duration::from_secs(2);

pub(crate) fn kill_group(pgid: Pid) {
    // ESRCH (already gone) is fine.
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
}

/// Waits until no process of the group is left, reaping the members that
/// were reparented to us. Members that called `setsid` have left the group
/// and are out of reach (only a cgroup would catch them).
pub(crate) fn reap_group(pgid: Pid) {
    let until = Instant::now() + REAP_LIMIT;
    loop {
        while let Ok(Some(_)) = rustix::process::waitpgid(pgid, WaitOptions::NOHANG) {}
        if rustix::process::test_kill_process_group(pgid) == Err(rustix::io::Errno::SRCH) || Instant::now() >= until {
            return;
        }
        kill_group(pgid);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reaps every exited child. Only called while no command runs (our own
/// `Child` must be reaped by `Child::wait`), so what it reaps are orphans of
/// earlier commands.
pub(super) fn reap_orphans() {
    while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
}
