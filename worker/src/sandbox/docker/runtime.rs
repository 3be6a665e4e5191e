//! The OCI runtime sandboxes run under (`KILN_SANDBOX_RUNTIME`), checked
//! against the engine once at worker start: a runtime the engine does not
//! know would otherwise fail every run, each with Docker's terse "unknown
//! or invalid runtime name". And whether it is gVisor, which the pids
//! limit must know (`pids`): told by the program the engine runs for it,
//! not by its name, which is the operator's choice (`runsc-kvm`); by the
//! name only where the engine names no program (a runtime registered by
//! its containerd shim).

use std::collections::HashMap;

use bollard::Docker;

/// Why the configured runtime cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "KILN_SANDBOX_RUNTIME is {wanted:?}, but the Docker engine has no runtime of that name (it has: {known}); \
         register it in the engine's daemon.json (\"runtimes\") and reload the engine, or unset KILN_SANDBOX_RUNTIME"
    )]
    Unknown { wanted: String, known: String },
    #[error("asking the Docker engine which runtimes it has: {0}")]
    Docker(#[from] bollard::errors::Error),
}

/// `Ok` when `wanted` is `None` (the engine's default) or a runtime the
/// engine has registered.
pub async fn check(docker: &Docker, wanted: Option<&str>) -> Result<(), RuntimeError> {
    let Some(wanted) = wanted else { return Ok(()) };
    let info = docker.info().await?;
    let mut known: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    if known.iter().any(|k| k == wanted) {
        return Ok(());
    }
    known.sort();
    Err(RuntimeError::Unknown { wanted: wanted.to_owned(), known: known.join(", ") })
}

/// The engine's runtimes, as it says: each name's program, and its default.
#[derive(Debug, Clone, Default)]
pub struct Runtimes {
    paths: HashMap<String, Option<String>>,
    default: Option<String>,
}

impl Runtimes {
    pub async fn of(docker: &Docker) -> Result<Self, RuntimeError> {
        let info = docker.info().await?;
        let paths = info.runtimes.unwrap_or_default().into_iter().map(|(name, r)| (name, r.path)).collect();
        Ok(Runtimes { paths, default: info.default_runtime })
    }

    /// Whether sandboxes asking for `wanted` (`None`: the engine's
    /// default) run under gVisor.
    pub fn is_gvisor(&self, wanted: Option<&str>) -> bool {
        let Some(name) = wanted.or(self.default.as_deref()) else { return false };
        is_gvisor(name, self.paths.get(name).and_then(Option::as_deref))
    }
}

/// Whether the runtime registered as `name`, running program `path`, is
/// gVisor: the program's file name is gVisor's (`runsc`, or a variant of
/// it). Without a path the name says: a runtime registered with a
/// containerd shim (`"runtimeType": "io.containerd.runsc.v1"` in
/// daemon.json) has no program, and the engine's `runtimeType` is not in
/// what the client reads of its answer, so an operator's `gvisor` or
/// `runsc-kvm`, or the shim's own name asked for directly, is recognised by
/// naming gVisor or `runsc`.
pub fn is_gvisor(name: &str, path: Option<&str>) -> bool {
    match path.filter(|p| !p.is_empty()) {
        Some(program) => program.rsplit('/').next().unwrap_or(program).starts_with("runsc"),
        None => {
            let name = name.to_ascii_lowercase();
            name.contains("runsc") || name.contains("gvisor")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gvisor_is_told_by_its_program_not_its_name() {
        assert!(is_gvisor("runsc", Some("runsc")));
        assert!(is_gvisor("runsc", None));
        assert!(is_gvisor("runsc-kvm", Some("/usr/bin/runsc")));
        assert!(is_gvisor("sandboxed", Some("/usr/local/lib/kiln-runsc/runsc")));
        assert!(!is_gvisor("runc", Some("runc")));
        assert!(!is_gvisor("runc", Some("/usr/bin/runc")));
        assert!(!is_gvisor("runsc", Some("/usr/bin/crun")), "the program decides");
    }

    #[test]
    fn a_runtime_without_a_program_is_told_by_its_name() {
        // Registered through containerd's `runtimeType`: no path.
        assert!(is_gvisor("gvisor", None));
        assert!(is_gvisor("gVisor-kvm", None));
        assert!(is_gvisor("io.containerd.runsc.v1", None));
        assert!(is_gvisor("kiln-runsc", Some("")));
        assert!(!is_gvisor("runc", None));
        assert!(!is_gvisor("io.containerd.runc.v2", None));
        assert!(!is_gvisor("crun", None));
        let runtimes = Runtimes { paths: HashMap::from([("gvisor".into(), None)]), default: Some("gvisor".into()) };
        assert!(runtimes.is_gvisor(None) && runtimes.is_gvisor(Some("gvisor")));
    }

    #[test]
    fn the_engines_default_counts_when_none_is_asked_for() {
        let paths = HashMap::from([("runc".into(), Some("runc".into())), ("gv".into(), Some("/usr/bin/runsc".into()))]);
        let runtimes = Runtimes { paths, default: Some("gv".into()) };
        assert!(runtimes.is_gvisor(None));
        assert!(runtimes.is_gvisor(Some("gv")));
        assert!(!runtimes.is_gvisor(Some("runc")));
        assert!(!Runtimes::default().is_gvisor(None));
    }
}
