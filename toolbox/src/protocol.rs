//! The toolbox wire protocol: plain serde types, no I/O.
//!
//! The worker and the toolbox exchange length-prefixed frames (see
//! [`crate::framing`]) whose bodies are these types as JSON. The worker sends
//! [`Request`]s; the toolbox sends [`ServerMessage`]s: first one
//! [`ServerMessage::Hello`], then [`ServerMessage::Output`] chunks while a
//! command runs and exactly one [`ServerMessage::Response`] per request.
//!
//! Compatibility rule for version 1: new optional fields and new request or
//! reply types may be added without a version bump (unknown fields are
//! ignored, an unknown request type gets an `unsupported` error); anything
//! else bumps [`PROTOCOL_VERSION`], which the worker checks in `Hello`.
//!
//! The types are split by direction: `request` (worker → toolbox), `reply`
//! (toolbox → worker), `error` (a failed request and whether the model can
//! act on it) and `render` (results as the model reads them). Everything is
//! re-exported here: callers use `protocol::X`.

use serde::{Deserialize, Serialize};

mod error;
mod render;
mod reply;
mod request;

pub use self::error::{ErrorKind, ToolError};
pub use self::reply::{
    BinaryInfo, CancelResult, CaptureResult, EditResult, ExecResult, FileKind, GlobResult, GrepFile, GrepLine,
    GrepResult, Hello, LsEntry, LsResult, Output, ProtocolError, Reply, Response, ServerMessage, SessionShell,
    StatResult, ViewResult, WriteResult,
};
pub use self::request::{
    CancelRequest, CaptureRequest, EditRequest, ExecRequest, GlobRequest, GrepRequest, LsRequest, Request, RequestBody,
    StatRequest, ViewRequest, WriteRequest,
};

/// Version of this protocol; sent in [`Hello`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame body either side accepts. Every reply is bounded well below
/// it (output caps, result caps), so only a broken peer ever hits it.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Defaults a request gets when the JSON leaves a field out.
pub mod defaults {
    pub const EXEC_TIMEOUT_MS: u64 = 120_000;
    pub const EXEC_OUTPUT_CAP_BYTES: u64 = 30_000;
    /// The exec output cap is clamped to this so a result always fits a frame.
    pub const EXEC_OUTPUT_CAP_MAX: u64 = 4 * 1024 * 1024;
    pub const VIEW_LIMIT: u64 = 2000;
    pub const VIEW_MAX_LINE_CHARS: u64 = 2000;
    pub const VIEW_MAX_BYTES: u64 = 100 * 1024;
    pub const LS_MAX_ENTRIES: u64 = 1000;
    pub const GLOB_MAX_RESULTS: u64 = 1000;
    pub const GREP_MAX_RESULTS: u64 = 200;
}

/// Size and modification time: what the worker remembers from a view and
/// hands back as a precondition of write/edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileVersion {
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

#[cfg(test)]
mod tests;
