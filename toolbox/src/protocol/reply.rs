//! Server messages (toolbox → worker): the hello, streamed output, and one
//! response per request carrying a [`Reply`]: a typed result, or an error.

use serde::{Deserialize, Serialize};

use super::{FileVersion, ToolError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// Always the first frame.
    Hello(Hello),
    /// A chunk of a running command's output (stdout and stderr merged,
    /// sanitized like the final output). Always before that request's response.
    Output(Output),
    /// The one answer to request `id`.
    Response(Response),
    /// A frame that could not be tied to any request (unreadable, no id,
    /// oversize). The connection stays usable.
    ProtocolError(ProtocolError),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub toolbox_version: String,
    pub pid: u32,
    /// Programs the sandbox needs that its image lacks (`bash`): the worker
    /// refuses such a sandbox at start with a clear error, rather than let
    /// every command fail. Absent from toolboxes older than this field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The shell commands run with. Absent from toolboxes older than this
    /// field (they run bash, or name it in `missing`); a worker that reads
    /// it runs any image, a shell or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<SessionShell>,
}

/// Which shell a session's commands run with: the image's `bash`, else its
/// POSIX `sh`, else none (commands cannot run; the file tools still work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionShell {
    Bash,
    Sh,
    /// The image has neither.
    #[serde(rename = "none")]
    Absent,
    /// A value added by a newer toolbox.
    #[serde(other)]
    Other,
}

impl SessionShell {
    /// The program's name, as the model and the logs read it.
    pub fn program(self) -> Option<&'static str> {
        match self {
            SessionShell::Bash => Some("bash"),
            SessionShell::Sh => Some("sh"),
            SessionShell::Absent | SessionShell::Other => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Output {
    pub id: u64,
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub result: Reply,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProtocolError {
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Exec(ExecResult),
    View(ViewResult),
    Write(WriteResult),
    Edit(EditResult),
    Ls(LsResult),
    Glob(GlobResult),
    Grep(GrepResult),
    Stat(StatResult),
    Pong,
    Cancel(CancelResult),
    Capture(CaptureResult),
    Error(ToolError),
}

impl Reply {
    /// Splits off the error reply, for callers that treat it as `Err`.
    pub fn into_result(self) -> Result<Reply, ToolError> {
        match self {
            Reply::Error(e) => Err(e),
            other => Ok(other),
        }
    }
}

/// How a capture ended; its stdout came before, as `Output` chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureResult {
    /// `None` when it was killed by a signal.
    pub exit_code: Option<i32>,
    /// Killed at the request's `timeout_ms`.
    pub timed_out: bool,
    /// Killed for sending more than the request's `max_bytes`.
    pub overflow: bool,
    /// The start of what it said on stderr (why it failed).
    pub stderr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// `None` when the shell was killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    /// stdout and stderr merged; ANSI sequences stripped, other control
    /// characters escaped, invalid UTF-8 replaced; head and tail kept around
    /// a `[... N bytes omitted ...]` marker.
    pub output: String,
    /// Bytes of (sanitized) output left out of `output`.
    pub truncated_bytes: u64,
    /// Bytes of (sanitized) output the command produced in all.
    pub total_bytes: u64,
    /// The session's working directory after the command.
    pub cwd: String,
    pub duration_ms: u64,
    /// Something the model should know beyond the output (e.g. the previous
    /// working directory had disappeared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewResult {
    /// The path as resolved (absolute).
    pub path: String,
    /// What the model sees: header, numbered lines, how to continue.
    pub text: String,
    pub version: FileVersion,
    /// The file's line count if `total_known`; otherwise the lines known to
    /// exist so far (a lower bound).
    pub total_lines: u64,
    /// Whether `total_lines` is exact. The first view of a large file reads
    /// only as far as its page; the count finishes in the background or on
    /// a later page. Absent from older toolboxes, which always counted.
    #[serde(default = "known")]
    pub total_known: bool,
    /// First and last line shown (1-based); `last_line < first_line` when none.
    pub first_line: u64,
    pub last_line: u64,
    /// Where the next page starts, if the file goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Set for binary files, whose content is described, not shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<BinaryInfo>,
    /// Some shown line was not valid UTF-8 (shown with U+FFFD).
    pub lossy: bool,
    /// Debug counter: bytes scanned for line breaks to find the first line
    /// of this page (from the index's frontier or its nearest checkpoint).
    pub bytes_scanned: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryInfo {
    /// Short type name: `png`, `jpeg`, `gif`, `webp`, `pdf`, `elf`, `gzip`, `zip`, or `binary`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResult {
    pub path: String,
    pub bytes_written: u64,
    pub created: bool,
    pub version: FileVersion,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditResult {
    pub path: String,
    pub replacements: u64,
    /// Unified diff of the change (capped).
    pub diff: String,
    pub version: FileVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsEntry {
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsResult {
    pub path: String,
    /// Sorted by name.
    pub entries: Vec<LsEntry>,
    /// Entries left out by `max_entries`.
    pub omitted: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobResult {
    /// Sorted. Paths under the toolbox's start directory (the workspace) are
    /// relative to it, as `view` takes them; others are absolute.
    pub paths: Vec<String>,
    pub omitted: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepLine {
    pub number: u64,
    pub text: String,
    /// `false` for a context line.
    pub is_match: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepFile {
    /// Relative to the workspace when under it (as in `GlobResult`).
    pub path: String,
    pub lines: Vec<GrepLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepResult {
    /// Files in path order, each with its matching (and context) lines.
    pub files: Vec<GrepFile>,
    /// Matching lines found in all, shown or not.
    pub total_matches: u64,
    /// Matching lines left out by `max_results`.
    pub omitted_matches: u64,
    /// Files that had a match, shown or not.
    pub files_with_matches: u64,
    /// Files skipped because they look binary.
    pub binary_files_skipped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatResult {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mtime_ns: i64,
}

impl StatResult {
    pub fn version(&self) -> FileVersion {
        FileVersion { size: self.size, mtime_ns: self.mtime_ns }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResult {
    pub target: u64,
    /// Whether an exec with that id was running (and has been killed).
    pub was_running: bool,
}

fn known() -> bool {
    true
}
