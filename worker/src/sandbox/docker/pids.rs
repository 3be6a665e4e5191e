//! The pids limit a sandbox's container gets. Under runc every process and
//! thread of the sandbox is a host task, so the container's pids cgroup is
//! set to `KILN_SANDBOX_PIDS` and holds the user's processes there.
//!
//! Under gVisor (`runsc` under whatever name the engine registers it,
//! see `runtime::is_gvisor`; ptrace platform) the host sees the Sentry's own
//! threads and the stub processes of each address space, not the user's
//! processes: measured here (gVisor 20240729) an idle sandbox holds ~45
//! host tasks, one with 150 background `sleep`s ~1,900 (~12 per process),
//! and the count does not fall when they exit (the Go runtime keeps its
//! threads). At the bare limit the Sentry could not start a thread and the
//! whole sandbox exited with code 2. So under runsc the host limit is
//! [`RUNSC_HOST_TASKS_PER_PROCESS`] times the operator's, and the user's
//! processes are held at `KILN_SANDBOX_PIDS` inside gVisor, by the
//! `nproc` rlimit (RLIMIT_NPROC), which gVisor's kernel counts per user
//! within the sandbox. (Not under runc: there the host kernel counts a uid's
//! processes across every container and the host, and the pids cgroup
//! already does the job.)

use bollard::models::ResourcesUlimits;

use crate::sandbox::SandboxConfig;

/// Host tasks (threads and stub processes) allowed per process the user
/// may run, under runsc: the measured ~12 with room to spare, 4,096 host
/// tasks at the default of 256.
pub const RUNSC_HOST_TASKS_PER_PROCESS: i64 = 16;

/// The container's pids cgroup limit; `gvisor`: sandboxes run under
/// gVisor (as the engine's runtime says, `runtime::Runtimes`).
pub fn host_limit(config: &SandboxConfig, gvisor: bool) -> i64 {
    if gvisor { config.pids_limit.saturating_mul(RUNSC_HOST_TASKS_PER_PROCESS) } else { config.pids_limit }
}

/// The container's rlimits: open files always, processes per user under
/// gVisor.
pub fn ulimits(config: &SandboxConfig, gvisor: bool) -> Vec<ResourcesUlimits> {
    let limit = |name: &str, n: i64| ResourcesUlimits { name: Some(name.into()), soft: Some(n), hard: Some(n) };
    let mut ulimits = vec![limit("nofile", config.nofile)];
    if gvisor {
        ulimits.push(limit("nproc", config.pids_limit));
    }
    ulimits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gvisor_is_left_its_threads_and_the_users_processes_are_capped_inside() {
        let config = SandboxConfig::default();
        assert_eq!(host_limit(&config, false), config.pids_limit);
        assert!(ulimits(&config, false).iter().all(|u| u.name.as_deref() != Some("nproc")));
        assert_eq!(host_limit(&config, true), config.pids_limit * RUNSC_HOST_TASKS_PER_PROCESS);
        let nproc = ulimits(&config, true).into_iter().find(|u| u.name.as_deref() == Some("nproc")).unwrap();
        assert_eq!((nproc.soft, nproc.hard), (Some(config.pids_limit), Some(config.pids_limit)));
    }
}
