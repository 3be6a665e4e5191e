//! The pieces of the `kiln` binary, as a library so the end-to-end tests
//! start Kiln exactly as the binary does.

pub mod app;
pub mod apply;
pub mod attempts;
pub mod base_url;
pub mod client;
pub mod commands;
pub mod env_command;
pub mod invocation;
pub mod local;
pub mod local_model;
pub mod render;
pub mod repo_arg;
pub mod run_options;
pub mod say;
pub mod settings;
pub mod telemetry;
pub mod toolbox_build;
pub mod up;
