//! The Kiln worker: claims queued runs, starts a sandbox container per
//! session and drives the agent loop whose tools run inside it.

pub mod agent;
pub mod callbacks;
pub mod config;
pub mod github;
mod handoff;
pub mod metrics;
pub mod providers;
pub mod retention;
mod run_task;
pub mod runner;
pub mod sandbox;
mod sandbox_reaper;
pub mod tools;

pub use config::{ProviderEndpoints, ProviderKind, Providers, UnknownProvider, WorkerConfig};
pub use runner::{Worker, WorkerContext};
