//! Kiln toolbox: one long-lived process inside a sandbox container that runs
//! the agent's commands and file tools, spoken to over stdin/stdout with
//! length-prefixed JSON frames.
//!
//! The worker depends on this crate for [`protocol`] (the message types) and
//! [`framing`] (the frame codec); the rest is the server side.

pub mod change_capture;
pub mod edit;
pub mod exec;
pub mod files;
pub mod framing;
pub mod identity;
pub mod line_count;
pub mod line_index;
pub mod output;
pub mod protocol;
pub mod search;
pub mod server;
pub mod view;
