//! What every part of the worker shares: the store, the sandbox backend
//! and the engine, the settings, the providers and the worker's presence. A leaf of the
//! worker's modules (it names their types but calls none of them), so the
//! claim loop, a run's life and everything under them can take it without
//! importing one another.

use std::sync::Arc;

use kiln_store::Store;

use crate::config::{Providers, WorkerConfig};
use crate::presence::Presence;
use crate::providers::pricing::PriceTable;
use crate::sandbox::Backend;
use crate::sandbox::environment_pools::EnvironmentPools;
use crate::tools::Registry;

/// Shared by the claim loop and every run task.
pub struct WorkerContext {
    pub store: Store,
    /// What runs the sandboxes (see `sandbox::backend`): everything that
    /// makes, finds, lists or removes one goes through it.
    pub sandboxes: Backend,
    pub config: WorkerConfig,
    pub providers: Providers,
    /// Prices per model, for cost budgets and `step.finished` events.
    pub prices: PriceTable,
    pub tools: Registry,
    /// This worker's lock: what its heartbeats ride on and its runs wait for.
    pub presence: Arc<Presence>,
    /// Warm containers of hot environments' prepared images.
    pub environment_pools: Arc<EnvironmentPools>,
    /// What each session's last capture here left that the next may take
    /// on trust (see `vouches`).
    pub capture_vouches: Arc<crate::vouches::Vouches>,
    /// Each run's sandbox handle from its workspace's readiness to its
    /// capture (see `sandbox::held`).
    pub held_sandboxes: Arc<crate::sandbox::held::HeldSandboxes>,
}
