//! A failed request, and whether the model can act on it (a tool result it
//! reads) or not (an infrastructure failure that ends the step).

use serde::{Deserialize, Serialize};

/// A failed request. `kind` says whether the model can act on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ToolError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ToolError { kind, message: message.into() }
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ToolError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    // The model can act on these: they go back to it as a tool error.
    NotFound,
    IsDirectory,
    NotADirectory,
    PermissionDenied,
    /// `edit`: `old_string` occurs more than once and `replace_all` is false.
    NotUnique,
    /// `edit`: `old_string` does not occur; the message shows the closest lines.
    NoMatch,
    /// The file changed since the version the request expected.
    Conflict,
    /// Not UTF-8 text (edit) or too large for the operation.
    NotText,
    TooLarge,
    InvalidArgument,
    /// Some other I/O failure on the path the model named (disk full, …).
    Io,
    /// No process or thread could be started: the sandbox is at its pids
    /// limit. Added in 0.1 without a version bump (an older worker reads
    /// `other`); the worker recovers by killing the sandbox's processes.
    ProcessLimit,
    // These are the worker's or the toolbox's problem, not the model's.
    /// The request could not be parsed.
    InvalidRequest,
    /// A request type this toolbox does not know (version skew).
    Unsupported,
    Internal,
    /// A kind added by a newer toolbox.
    #[serde(other)]
    Other,
}

impl ErrorKind {
    /// Whether this error is a normal tool result for the model (rather than
    /// an infrastructure failure that should end the step).
    pub fn is_model_fixable(self) -> bool {
        !matches!(self, ErrorKind::InvalidRequest | ErrorKind::Unsupported | ErrorKind::Internal | ErrorKind::Other)
    }
}
