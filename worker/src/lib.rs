//! The Kiln worker: claims queued runs, starts a sandbox container per
//! session and drives the agent loop whose tools run inside it.

pub mod agent;
pub mod attempts;
pub mod callbacks;
pub mod capture;
pub mod claim_loop;
pub mod config;
pub mod egress;
pub mod environment;
pub mod git_delivery;
pub mod github;
mod handoff;
mod lease_keeper;
mod local_checkout;
pub mod mcp;
pub mod metrics;
pub mod net_guard;
pub mod presence;
pub mod providers;
pub mod retention;
mod retry;
mod run;
mod run_lifecycle;
pub mod sandbox;
mod sandbox_reaper;
pub mod subagent;
pub mod tools;

pub use claim_loop::{Worker, WorkerContext};
pub use config::{ProviderEndpoints, ProviderKind, Providers, UnknownProvider, WorkerConfig};
