//! Each run's own sandbox handle, held from the moment its workspace is
//! ready until its change is captured: the capture then asks the run's own
//! toolbox, whose connection is open (no exec through the engine), however
//! the run ended. A cancel, the wall clock or a lost lease drop the run's
//! work, and the handle with it, before the capture runs; a clone kept here
//! keeps the connection (clones share it).
//!
//! Whatever takes the handle out ends its hold; [`Hold`] ends it when the
//! run's task ends, so no run leaves a toolbox connection behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use super::Sandbox;

/// The handles, by run.
#[derive(Debug, Default)]
pub struct HeldSandboxes {
    runs: Mutex<HashMap<Uuid, Sandbox>>,
}

impl HeldSandboxes {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Sandbox>> {
        // Single inserts and removes: a panic cannot leave it half-changed.
        self.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps a clone of `run`'s handle (replacing an earlier one).
    pub fn hold(&self, run: Uuid, sandbox: &Sandbox) {
        self.lock().insert(run, sandbox.clone());
    }

    /// The handle held for `run`, no longer held.
    pub fn take(&self, run: Uuid) -> Option<Sandbox> {
        self.lock().remove(&run)
    }

    /// Ends `run`'s hold when the returned guard drops.
    pub fn hold_until_dropped(self: &Arc<Self>, run: Uuid) -> Hold {
        Hold { held: self.clone(), run }
    }
}

/// Drops a run's held handle, if any is left, when the run's task ends
/// (also when it is torn down half-way).
#[derive(Debug)]
pub struct Hold {
    held: Arc<HeldSandboxes>,
    run: Uuid,
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.held.take(self.run));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxConfig;

    fn handle(name: &str) -> Sandbox {
        let docker = bollard::Docker::connect_with_unix_defaults().expect("a client (no connection is made)");
        Sandbox::bound(docker.into(), name.to_owned(), &SandboxConfig::default())
    }

    #[test]
    fn a_held_handle_is_taken_once_and_a_hold_ends_with_its_guard() {
        let held = Arc::new(HeldSandboxes::default());
        let (run, other) = (Uuid::now_v7(), Uuid::now_v7());
        held.hold(run, &handle("a"));
        assert!(held.take(run).is_some());
        assert!(held.take(run).is_none(), "taken once");

        held.hold(other, &handle("b"));
        drop(held.hold_until_dropped(other));
        assert!(held.take(other).is_none(), "the guard ended the hold");
    }
}
