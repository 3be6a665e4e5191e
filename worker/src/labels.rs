//! The labels Kiln puts on what it creates on the engine (containers,
//! session networks): cleanup and the reaper find them by these. A leaf, so
//! the egress side can label its networks without importing the sandbox
//! (which imports egress to give a sandbox its network).

/// Label on every container Kiln creates; cleanup finds them by it.
pub const LABEL_MANAGED: &str = "dev.kiln.managed";
pub const LABEL_RUN: &str = "dev.kiln.run";
pub const LABEL_SESSION: &str = "dev.kiln.session";
pub const LABEL_WORKER: &str = "dev.kiln.worker";
/// On warm containers not yet given to a session.
pub const LABEL_POOL: &str = "dev.kiln.pool";
