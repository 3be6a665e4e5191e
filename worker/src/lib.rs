//! The Kiln worker: claims queued runs, starts a sandbox container per
//! session and drives the agent loop whose tools run inside it.

pub mod agent;
pub mod attempts;
pub mod callbacks;
pub mod capture;
pub mod claim_loop;
pub mod config;
pub mod context;
pub mod db_retry;
pub mod delivery;
pub mod egress;
pub mod environment;
pub mod event_sink;
pub mod git_delivery;
pub mod github;
mod handoff;
pub mod labels;
mod lease_keeper;
mod local_checkout;
pub mod mcp;
pub mod metrics;
pub mod net_guard;
pub mod origin;
mod owed;
pub mod presence;
pub mod providers;
pub mod retention;
mod retry;
mod run;
mod run_heartbeat;
mod run_lifecycle;
pub mod sandbox;
mod sandbox_reaper;
pub mod subagent;
pub mod tools;
pub mod toolset;
mod vouches;

pub use claim_loop::Worker;
pub use config::{ProviderEndpoints, ProviderKind, Providers, UnknownProvider, WorkerConfig};
pub use context::WorkerContext;
