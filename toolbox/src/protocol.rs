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

use serde::{Deserialize, Serialize};

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

// ---------------------------------------------------------------------------
// Requests (worker → toolbox)
// ---------------------------------------------------------------------------

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

/// Size and modification time: what the worker remembers from a view and
/// hands back as a precondition of write/edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileVersion {
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
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

/// Kill the running exec with this request id (its whole process group).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub target: u64,
}

// ---------------------------------------------------------------------------
// Server messages (toolbox → worker)
// ---------------------------------------------------------------------------

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
    pub total_lines: u64,
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
    /// Debug counter: bytes scanned for line breaks to answer this call
    /// (building the line index plus seeking from the nearest checkpoint).
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

// ---------------------------------------------------------------------------
// Model-facing renderings of the structured results (pure functions, so the
// worker can call them without the toolbox).
// ---------------------------------------------------------------------------

impl LsResult {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            match e.kind {
                FileKind::Dir => out.push_str(&format!("{}/\n", e.name)),
                FileKind::Symlink => out.push_str(&format!("{}@\n", e.name)),
                FileKind::File | FileKind::Other => out.push_str(&format!("{}\t{} bytes\n", e.name, e.size)),
            }
        }
        if self.entries.is_empty() {
            out.push_str("(empty directory)\n");
        }
        if self.omitted > 0 {
            out.push_str(&format!("[... {} more entries not shown]\n", self.omitted));
        }
        out
    }
}

impl GlobResult {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.paths {
            out.push_str(p);
            out.push('\n');
        }
        if self.paths.is_empty() {
            out.push_str("no files matched\n");
        }
        if self.omitted > 0 {
            out.push_str(&format!("[... {} more files not shown; narrow the pattern]\n", self.omitted));
        }
        out
    }
}

impl GrepResult {
    /// ripgrep-like: `path:line:text` for matches, `path-line-text` for context.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            let mut prev: Option<u64> = None;
            for l in &f.lines {
                if prev.is_some_and(|p| l.number > p + 1) {
                    out.push_str("--\n");
                }
                let sep = if l.is_match { ':' } else { '-' };
                out.push_str(&format!("{}{sep}{}{sep}{}\n", f.path, l.number, l.text));
                prev = Some(l.number);
            }
        }
        if self.total_matches == 0 {
            out.push_str("no matches\n");
        }
        if self.omitted_matches > 0 {
            out.push_str(&format!(
                "[... {} more matching lines not shown ({} matches in {} files in all); narrow the search]\n",
                self.omitted_matches, self.total_matches, self.files_with_matches
            ));
        }
        out
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_are_flat_json_with_a_type_tag() {
        let req = Request { id: 7, body: RequestBody::View(ViewRequest::new("a.rs")) };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(
            v,
            json!({"id": 7, "type": "view", "path": "a.rs", "offset": 1, "limit": 2000,
                   "max_line_chars": 2000, "max_bytes": 102400})
        );
        assert_eq!(serde_json::from_value::<Request>(v).unwrap(), req);
    }

    #[test]
    fn omitted_fields_take_defaults_and_unknown_fields_are_ignored() {
        let req: Request =
            serde_json::from_value(json!({"id": 1, "type": "exec", "command": "ls", "future": 1})).unwrap();
        assert_eq!(req, Request { id: 1, body: RequestBody::Exec(ExecRequest::new("ls")) });
        let ping: Request = serde_json::from_value(json!({"id": 2, "type": "ping"})).unwrap();
        assert_eq!(ping.body, RequestBody::Ping);
    }

    #[test]
    fn responses_nest_the_reply_under_result() {
        let msg = ServerMessage::Response(Response {
            id: 3,
            result: Reply::Error(ToolError::new(ErrorKind::NotFound, "no such file: x")),
        });
        let v = serde_json::to_value(&msg).unwrap();
        assert_eq!(
            v,
            json!({"type": "response", "id": 3,
                   "result": {"type": "error", "kind": "not_found", "message": "no such file: x"}})
        );
        assert_eq!(serde_json::from_value::<ServerMessage>(v).unwrap(), msg);
    }

    #[test]
    fn unknown_error_kinds_from_a_newer_toolbox_still_parse() {
        let e: ToolError = serde_json::from_value(json!({"kind": "quota_exceeded", "message": "m"})).unwrap();
        assert_eq!(e.kind, ErrorKind::Other);
        assert!(!e.kind.is_model_fixable());
        assert!(ErrorKind::NotUnique.is_model_fixable());
    }

    #[test]
    fn grep_render_separates_non_adjacent_groups() {
        let r = GrepResult {
            files: vec![GrepFile {
                path: "a.rs".into(),
                lines: vec![
                    GrepLine { number: 1, text: "fn a()".into(), is_match: true },
                    GrepLine { number: 2, text: "}".into(), is_match: false },
                    GrepLine { number: 9, text: "fn b()".into(), is_match: true },
                ],
            }],
            total_matches: 3,
            omitted_matches: 1,
            files_with_matches: 1,
            binary_files_skipped: 0,
        };
        let text = r.render();
        assert!(text.starts_with("a.rs:1:fn a()\na.rs-2-}\n--\na.rs:9:fn b()\n"), "{text}");
        assert!(text.contains("1 more matching lines"));
    }
}
