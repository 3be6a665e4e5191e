//! Shared pieces of the sandbox and agent-loop benchmarks: command-line
//! options, figures (median, p95, ratios against a goal), execs through the
//! Docker API and timing the Docker CLI, and sandboxes set up as the worker
//! sets them up.
//!
//! These are figures, not timed tests: each binary measures Kiln and its
//! baseline side by side, in one run, on one image, and prints both.

pub mod api;
pub mod cli;
pub mod delay_proxy;
pub mod egress_fetch;
pub mod kiln;
pub mod server;
pub mod setup;
pub mod stats;
pub mod workload;
