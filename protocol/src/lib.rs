//! The shared vocabulary of Kiln.
//!
//! Every type here is plain data with serde derives. The worker writes these
//! types, the store persists them, the API serves them; none of those crates
//! redefines them. This crate does no I/O.

// First: its macros (the character classes) serve the modules below.
#[macro_use]
pub mod rules;

pub mod address;
pub mod agents;
pub mod attempts;
pub mod callback;
pub mod callback_url;
pub mod changes;
pub mod deliver;
pub mod egress;
pub mod environment;
pub mod event;
pub mod image_name;
pub mod input;
pub mod mcp;
pub mod message;
mod nested;
pub mod repo_url;
pub mod run;
mod schema;

pub use attempts::{GroupLimits, SelectAttempt};
pub use callback::CallbackBody;
pub use egress::{EgressMode, EgressPolicy, HostRule};
pub use environment::{Environment, EnvironmentSpec};
pub use event::{EventBody, EventRecord, StoredEvent, TodoItem, TodoStatus};
pub use message::{Message, Part, Role, Usage};
pub use run::{
    ApprovalMode, CreateRun, Limits, ModelSpec, NetworkMode, Policy, RepoSpec, Run, RunStatus, SandboxSpec, Trigger,
};
