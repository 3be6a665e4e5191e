//! Requests (worker → toolbox): one flat JSON object each, `id` and a `type`
//! tag beside the fields; a field left out takes its value from
//! [`super::defaults`].

use serde::{Deserialize, Serialize};

use super::{FileVersion, defaults};

/// One request; `id` is chosen by the worker and echoed on every frame that
/// answers it. Serialized flat: `{"id": 7, "type": "view", "path": "a.rs"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub body: RequestBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequestBody {
    Exec(ExecRequest),
    View(ViewRequest),
    Write(WriteRequest),
    Edit(EditRequest),
    Ls(LsRequest),
    Glob(GlobRequest),
    Grep(GrepRequest),
    Stat(StatRequest),
    Ping,
    Cancel(CancelRequest),
    Capture(CaptureRequest),
}

/// Run `bash -c command`. Commands of one toolbox run one at a time; the
/// working directory and exported variables carry over to the next command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub command: String,
    /// Run here instead of the session's current directory (relative to it
    /// if relative); the session's directory then becomes wherever the
    /// command ends up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra variables for this command only (unless the command itself
    /// changes them, in which case the change persists). JSON: `[["K", "v"]]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    #[serde(default = "exec_timeout_ms")]
    pub timeout_ms: u64,
    /// Output kept in the result: head and tail, the middle cut with a marker.
    #[serde(default = "exec_output_cap")]
    pub output_cap_bytes: u64,
    /// Stop streaming `Output` frames after this many bytes (the result still
    /// keeps head and tail). `None`: stream everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_cap_bytes: Option<u64>,
}

impl ExecRequest {
    pub fn new(command: impl Into<String>) -> Self {
        ExecRequest {
            command: command.into(),
            cwd: None,
            env: Vec::new(),
            timeout_ms: defaults::EXEC_TIMEOUT_MS,
            output_cap_bytes: defaults::EXEC_OUTPUT_CAP_BYTES,
            stream_cap_bytes: None,
        }
    }
}

/// Numbered lines of a file. Relative paths are relative to the directory
/// the toolbox was started in (the workspace), not the exec cwd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewRequest {
    pub path: String,
    /// First line to show, 1-based.
    #[serde(default = "one")]
    pub offset: u64,
    #[serde(default = "view_limit")]
    pub limit: u64,
    #[serde(default = "view_max_line_chars")]
    pub max_line_chars: u64,
    /// Budget for the whole rendered text.
    #[serde(default = "view_max_bytes")]
    pub max_bytes: u64,
}

impl ViewRequest {
    pub fn new(path: impl Into<String>) -> Self {
        ViewRequest {
            path: path.into(),
            offset: 1,
            limit: defaults::VIEW_LIMIT,
            max_line_chars: defaults::VIEW_MAX_LINE_CHARS,
            max_bytes: defaults::VIEW_MAX_BYTES,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteRequest {
    pub path: String,
    pub content: String,
    /// Refuse (`conflict`) unless the file is still at this version; `None`
    /// writes whatever is there (or creates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<FileVersion>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EditRequest {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<FileVersion>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LsRequest {
    pub path: String,
    #[serde(default = "ls_max_entries")]
    pub max_entries: u64,
}

/// Files whose path matches `pattern` under `path`, `.gitignore` respected and
/// `.git` skipped. A pattern without `/` matches file names at any depth
/// (`*.rs`); one with `/` matches the path relative to `path` (`src/**/*.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobRequest {
    pub pattern: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default = "glob_max_results")]
    pub max_results: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrepRequest {
    /// A regular expression (Rust `regex` syntax), or a literal string.
    pub pattern: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only search files matching this glob (same rules as `GlobRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    #[serde(default)]
    pub literal: bool,
    #[serde(default)]
    pub case_insensitive: bool,
    /// Lines of context before and after each match.
    #[serde(default)]
    pub context: u32,
    /// Matching lines returned; the rest are counted.
    #[serde(default = "grep_max_results")]
    pub max_results: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatRequest {
    pub path: String,
}

/// Take the run's change: the toolbox runs its own `capture` subcommand
/// (`crate::change_capture`) as the command user with `args`, and streams
/// its stdout back as `Output` chunks, each the base64 of a run of bytes
/// (the patch is binary), then a [`super::CaptureResult`]. Over the
/// connection the worker already holds: no exec through the engine, which
/// is most of a capture's time on a large repository (issue 28).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureRequest {
    /// The subcommand's arguments: `BASE SESSION_BASE SUMMARY_CAP
    /// MAX_PATCH VOUCH_INDEX VOUCH_BASE`.
    pub args: Vec<String>,
    /// The capture is killed after this long.
    pub timeout_ms: u64,
    /// Most bytes of stdout sent; past it the capture is killed and its
    /// result says `overflow`.
    pub max_bytes: u64,
}

/// Kill the running exec with this request id (its whole process group).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub target: u64,
}

// `#[serde(default = "…")]` takes a function, not a constant.
fn one() -> u64 {
    1
}
fn exec_timeout_ms() -> u64 {
    defaults::EXEC_TIMEOUT_MS
}
fn exec_output_cap() -> u64 {
    defaults::EXEC_OUTPUT_CAP_BYTES
}
fn view_limit() -> u64 {
    defaults::VIEW_LIMIT
}
fn view_max_line_chars() -> u64 {
    defaults::VIEW_MAX_LINE_CHARS
}
fn view_max_bytes() -> u64 {
    defaults::VIEW_MAX_BYTES
}
fn ls_max_entries() -> u64 {
    defaults::LS_MAX_ENTRIES
}
fn glob_max_results() -> u64 {
    defaults::GLOB_MAX_RESULTS
}
fn grep_max_results() -> u64 {
    defaults::GREP_MAX_RESULTS
}
