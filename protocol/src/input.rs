//! The rule of every field a client sends in a body: what
//! [`crate::CreateRun::validate`] and the API's handlers check, and what
//! the OpenAPI document states (see [`crate::rules`]).

use crate::rules::{Constraint, List, NO_CONTROL, NO_NUL, NOT_BLANK_NO_NUL, OneOf, Pattern, Range, Text, TextExcept};

/// Longest prompt, in characters. A prompt is sent to the model on every
/// step, so an unbounded one is a cost and memory hazard.
pub const MAX_PROMPT_CHARS: usize = 64 * 1024;

/// `prompt` of a run, and the `text` of a message to one.
pub static PROMPT: Text = Text::new(1, MAX_PROMPT_CHARS, NOT_BLANK_NO_NUL);

/// An egress rule's host (`sandbox.egress.allow[].host`): a name or a
/// `*.name` pattern, labels of letters, digits, `-` and `_`.
pub static EGRESS_HOST: Text = Text::new(1, 253, r"^(\*\.)?[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*$");
/// A port of an egress rule (`…allow[].ports[]`).
pub static EGRESS_PORT: Range<u16> = Range::new(1, 65_535);
/// An HTTP method of an egress rule (`…allow[].methods[]`), upper case.
pub static EGRESS_METHOD: Text = Text::new(1, 32, r"^[A-Z]+$");
/// A path prefix of an egress rule (`…allow[].path_prefixes[]`).
pub static EGRESS_PATH_PREFIX: Text = Text::new(1, 253, concat!("^/[^", control!(), "]*$"));

/// `limits.max_steps`: model calls.
pub static MAX_STEPS: Range<u32> = Range::new(1, 500);
/// `limits.timeout_s`: up to one day.
pub static TIMEOUT_S: Range<u32> = Range::new(1, 86_400);
/// `limits.max_tokens`: within a signed 64-bit integer, what the document's
/// `int64` and most clients can hold.
pub static RUN_MAX_TOKENS: Range<u64> = Range::new(1, i64::MAX as u64);
/// `limits.max_cost_usd`.
pub static MAX_COST_USD: Range<f64> = Range::above(0.0, 1_000_000.0);

/// `allowed_tools`: at most this many names, each a [`TOOL_NAME`].
pub static ALLOWED_TOOLS: List = List { max_items: 64 };
/// A tool name, or a pattern of them with `*` (`mcp__github__*`).
pub static TOOL_NAME: Text = Text::new(1, 64, r"^[A-Za-z0-9_*-]*$");

/// `mcp`: at most this many server names, each an [`MCP_SERVER_NAME`].
pub static MCP_SERVERS: List = List { max_items: 32 };
/// The name of an MCP server (the operator's file, an environment's
/// `mcp_servers`, a repository's file, a run's `mcp`): letters, digits,
/// `-` and single `_`s between them — no `__`, no `_` at either end.
///
/// Its tools are named `mcp__<server>__<tool>` (what the providers allow:
/// no other separator character is free), so the first `__` after `mcp__`
/// must always be the separator: with `github__x` or `github_` allowed,
/// `mcp__github__*` would also match their tools. Forbidding `_` outright
/// would say the same more bluntly but refuse names like `my_server`
/// that deployments already use; this rule refuses only the names that
/// were ambiguous.
pub static MCP_SERVER_NAME: Text = Text::new(1, 64, r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$");
/// What a refused [`MCP_SERVER_NAME`] is told.
pub const MCP_SERVER_NAME_RULE: &str =
    "letters, digits, - and _, with no \"__\" and no _ at either end (a tool is named mcp__<server>__<tool>)";

/// `agents`: at most this many kind names, each an [`AGENT_KIND_NAME`].
pub static AGENTS: List = List { max_items: 32 };
/// The name of a sub-agent kind (`explore`, or one the operator defines).
pub static AGENT_KIND_NAME: Text = Text::new(1, 64, r"^[A-Za-z0-9_-]*$");

/// `attempts`: how many attempts a group has (a deployment may allow
/// fewer, `KILN_MAX_ATTEMPTS`).
pub static ATTEMPTS: Range<u32> = Range::new(1, 4);
/// `attempt_models`: one [`MODEL_NAME`] per attempt.
pub static ATTEMPT_MODELS: List = List { max_items: 4 };

/// The providers a run may name; the worker maps each to its wire format.
pub static MODEL_PROVIDER: OneOf = OneOf(&["openai", "openai-responses", "anthropic"]);
/// `model.name`: it goes to the provider, into logs and into metrics labels.
pub static MODEL_NAME: Text = Text::new(1, 200, NO_CONTROL);
/// `model.max_tokens`: output tokens per model call.
pub static MODEL_MAX_TOKENS: Range<u32> = Range::new(1, 1_000_000);
/// `model.temperature`.
pub static TEMPERATURE: Range<f64> = Range::new(0.0, 2.0);
/// `model.context_window`, in tokens.
pub static CONTEXT_WINDOW: Range<u32> = Range::new(1_000, 10_000_000);

/// `sandbox.memory_mb`.
pub static SANDBOX_MEMORY_MB: Range<u32> = Range::new(64, 1_048_576);
/// `sandbox.cpus`.
pub static SANDBOX_CPUS: Range<f64> = Range::new(0.05, 256.0);
/// `sandbox.pids`.
pub static SANDBOX_PIDS: Range<u32> = Range::new(16, 1_000_000);

/// Characters a URL or ref must never hold: white space and controls.
macro_rules! no_space {
    () => {
        concat!(white_space!(), control!())
    };
}

/// A URL's host: a host name of dot-separated labels whose last label
/// starts with a letter (so that no URL parser reads it as an IPv4 address)
/// and with no `--` (so that none is read as punycode), an IPv4 address, or
/// an IPv6 address in brackets (without an embedded IPv4 address or a zone).
macro_rules! url_host {
    () => {
        concat!(
            r"(?:",
            // A host name.
            r"(?:[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*\.)*[A-Za-z][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*",
            // An IPv4 address.
            r"|(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}",
            // An IPv6 address.
            r"|\[(?:",
            r"(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,7}:",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,6}:[0-9A-Fa-f]{1,4}",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,5}(?::[0-9A-Fa-f]{1,4}){1,2}",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,4}(?::[0-9A-Fa-f]{1,4}){1,3}",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,3}(?::[0-9A-Fa-f]{1,4}){1,4}",
            r"|(?:[0-9A-Fa-f]{1,4}:){1,2}(?::[0-9A-Fa-f]{1,4}){1,5}",
            r"|[0-9A-Fa-f]{1,4}:(?::[0-9A-Fa-f]{1,4}){1,6}",
            r"|:(?:(?::[0-9A-Fa-f]{1,4}){1,7}|:)",
            r")\])"
        )
    };
}

/// An optional port, 0 to 65535.
macro_rules! url_port {
    () => {
        r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
    };
}

/// `repo.url`, handed to `git clone` on the worker: a URL of a scheme git
/// cannot read as an option or a helper invocation (`-u…`, `ext::…`), with a
/// host of the same grammar as [`CALLBACK_URL`]'s (so every URL of this
/// shape parses, see [`crate::repo_url`]) and no credentials: only ssh
/// names a user (`ssh://git@host/…`, `git@host:owner/repo`). `file:///`
/// takes any local path (the worker refuses it unless the deployment allows it).
pub static REPO_URL: Text = Text::new(
    1,
    2048,
    concat!(
        "^(?:",
        // https, http and git: no user.
        r"(?:https?|git)://",
        url_host!(),
        url_port!(),
        r"(?:[/?#][^",
        no_space!(),
        r"]*)?",
        // ssh: an optional user.
        r"|ssh://(?:[A-Za-z0-9._-]+@)?",
        url_host!(),
        url_port!(),
        r"(?:[/?#][^",
        no_space!(),
        r"]*)?",
        // file: an absolute local path.
        r"|file:///[^",
        no_space!(),
        r"]*",
        // scp-like ssh: `[user@]host:path`, the host without a port, the
        // path without a colon and not starting `//` (git reads anything
        // holding `://` as a URL).
        r"|(?:[A-Za-z0-9._-]+@)?",
        url_host!(),
        r":(?:/?[^:/",
        no_space!(),
        r"][^:",
        no_space!(),
        r"]*)?",
        ")$"
    ),
);

/// [`REPO_URL`] without `git://` and ssh: what a deployment without
/// `KILN_ALLOW_GIT_PROTOCOLS` accepts (its document states this one).
pub static REPO_URL_WEB: Text = Text::new(
    1,
    2048,
    concat!(
        "^(?:",
        r"https?://",
        url_host!(),
        url_port!(),
        r"(?:[/?#][^",
        no_space!(),
        r"]*)?",
        r"|file:///[^",
        no_space!(),
        r"]*",
        ")$"
    ),
);

/// `repo.ref`: a plain git ref name. Not an option (`-…`), no `..`, none of
/// `~^:?*[\` (git's own rules) and no white space or controls.
pub static GIT_REF: Text = Text::new(
    1,
    255,
    // A run of allowed characters with single dots between; the first
    // character is not `-`.
    concat!(
        r"^(?:\.(?:[^",
        no_space!(),
        r"~\^:?*\[\\.]+\.)*[^",
        no_space!(),
        r"~\^:?*\[\\.]*",
        r"|[^",
        no_space!(),
        r"~\^:?*\[\\.\-][^",
        no_space!(),
        r"~\^:?*\[\\.]*(?:\.[^",
        no_space!(),
        r"~\^:?*\[\\.]+)*\.?)$"
    ),
);

/// Longest `callback_url`, in characters.
pub const MAX_CALLBACK_URL_CHARS: usize = 2048;

/// `callback_url`: an http(s) URL of a host name or IP address, with an
/// optional port, path and query; no credentials, no fragment, no white
/// space. Host names are dot-separated labels whose last label starts with
/// a letter (so that no URL parser reads it as an IPv4 address) and with no
/// `--` (so that none is read as punycode).
pub static CALLBACK_URL: Text = Text::new(
    1,
    MAX_CALLBACK_URL_CHARS,
    concat!(
        r"^[Hh][Tt][Tt][Pp][Ss]?://",
        url_host!(),
        url_port!(),
        // A path and query.
        r"(?:[/?][^#",
        no_space!(),
        r"]*)?$"
    ),
);

/// The `call_id` of an approval: Kiln's id for the call (`{step}-{n}`), or
/// in runs from before Kiln issued its own, the provider's as it was sent;
/// only what could not travel in a URL path or a log line is refused.
pub static CALL_ID: Text = Text::new(1, 256, NO_CONTROL);
/// `reason` of an approval decision, passed to the model with a denial.
pub static DECISION_REASON: Text = Text::new(0, 4096, NO_NUL);

/// `deliver.git.branch`: a stricter form of `git check-ref-format
/// refs/heads/<name>` that a pattern can state: `/`-separated components of
/// letters, digits, `_` and `-`, with single dots between runs of them (no
/// leading, trailing or double dot), none ending in `.lock`, the first not
/// starting with `-`.
pub static DELIVER_BRANCH: Text = Text::new(
    1,
    200,
    concat!(
        r"^[A-Za-z0-9_][A-Za-z0-9_-]*",
        r"(?:(?:\.[A-Za-z0-9_-]+)*\.(?:[A-Za-z0-9_-]{1,3}|[A-Za-z0-9_-]{5,}|[A-Za-km-z0-9_-][A-Za-z0-9_-]{3}",
        r"|l[A-Za-np-z0-9_-][A-Za-z0-9_-]{2}|lo[A-Zabd-z0-9_-][A-Za-z0-9_-]|loc[A-Za-jl-z0-9_-]))?",
        r"(?:/[A-Za-z0-9_-]+",
        r"(?:(?:\.[A-Za-z0-9_-]+)*\.(?:[A-Za-z0-9_-]{1,3}|[A-Za-z0-9_-]{5,}|[A-Za-km-z0-9_-][A-Za-z0-9_-]{3}",
        r"|l[A-Za-np-z0-9_-][A-Za-z0-9_-]{2}|lo[A-Zabd-z0-9_-][A-Za-z0-9_-]|loc[A-Za-jl-z0-9_-]))?)*$",
    ),
);
/// `deliver.git.author_name` and `author_email`: no control characters and
/// no `<` or `>` (they would end the identity in the commit header).
pub static DELIVER_AUTHOR: Text = Text::new(1, 200, r"^[^\x00-\x1f\x7f<>]+$");
/// `deliver.git.message`.
pub static DELIVER_MESSAGE: Text = Text::new(1, 4000, NO_NUL);

/// `environment` of a run, and `name` of an environment: lower-case, so a
/// name is one thing whatever the client's case habits.
pub static ENVIRONMENT_NAME: Text = Text::new(1, 64, r"^[a-z0-9][a-z0-9._-]*$");
/// A path component of an image name: lower-case letters and digits in
/// runs joined by one of `sep`.
macro_rules! image_component {
    ($sep:literal) => {
        concat!("[a-z0-9]+((", $sep, ")[a-z0-9]+)*")
    };
}

/// A registry host of an image name as Kiln reads one: labels of letters,
/// digits and `-`, with a dot or a port (up to five digits) or both.
macro_rules! image_host {
    () => {
        r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:[0-9]{1,5})?|[A-Za-z0-9-]+:[0-9]{1,5}"
    };
}

/// `image` of an environment: a Docker image reference (name, tag,
/// digest); never an option to anything (no leading `-`). Its shape only:
/// which names are images an environment may use (no ids, no id prefixes,
/// none of Kiln's own, one the operator allows) is
/// [`crate::image_name::ImagePatterns::check`]'s to say.
///
/// Stated exactly, so that the document and [`ImageName::parse`] agree
/// (`image_name`'s tests hold them together): Docker's reference grammar
/// (`[host[:port]/]path[:tag]` or `…@sha256:<64 hex>`, lower-case path
/// components joined by `.`, `_`, `__` or dashes; the first of several
/// parts is a host when it holds a `.` or `:` or is `localhost`), except a
/// name the engine could read as an image id (`sha256:…`, a repository all
/// hex, also under Docker Hub's `docker.io/[library/]`) and Kiln's own
/// images (`kiln-env…`, `kiln-snapshot…`, `kiln-probe…`, `kiln-warm…`).
///
/// [`ImageName::parse`]: crate::image_name::ImageName::parse
pub static IMAGE: TextExcept<3> = TextExcept {
    text: Text::new(
        1,
        255,
        concat!(
            "^(",
            image_component!(r"[._]|__|-+"),
            "|(",
            image_host!(),
            "|",
            image_component!(r"_|__|-+"),
            ")(/",
            image_component!(r"[._]|__|-+"),
            ")+)(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})?$"
        ),
    ),
    except: [
        Pattern::new(r"^sha(256|384|512):"),
        Pattern::new(r"^((docker\.io|index\.docker\.io)/(library/)?)?[0-9A-Fa-f]+(:[^/]*|@.*)?$"),
        Pattern::new(r"^((docker\.io|index\.docker\.io)/(library/)?)?kiln-(env|snapshot|probe|warm)"),
    ],
};
/// Longest setup or maintenance script, in characters.
pub const MAX_SCRIPT_CHARS: usize = 64 * 1024;
/// `setup_script` and `maintenance_script`.
pub static SCRIPT: Text = Text::new(0, MAX_SCRIPT_CHARS, NO_NUL);
/// `variables` and `secrets`: at most this many entries.
pub static ENV_ENTRIES: List = List { max_items: 64 };
/// A variable's or secret's name: what a shell accepts.
pub static ENV_VAR_NAME: Text = Text::new(1, 128, r"^[A-Za-z_][A-Za-z0-9_]*$");
/// A variable's or secret's value.
pub static ENV_VAR_VALUE: Text = Text::new(0, 8 * 1024, NO_NUL);
/// `lock_files`: at most this many globs, each a [`LOCK_GLOB`].
pub static LOCK_FILES: List = List { max_items: 64 };
pub static LOCK_GLOB: Text = Text::new(1, 256, NO_CONTROL);

/// The rule of `variables` and `secrets` as a whole: at most
/// [`ENV_ENTRIES`] entries named by [`ENV_VAR_NAME`] with values of
/// [`ENV_VAR_VALUE`].
pub struct EnvMap;

impl Constraint for EnvMap {
    fn keywords(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut k = serde_json::Map::new();
        k.insert("maxProperties".into(), serde_json::json!(ENV_ENTRIES.max_items));
        k.insert("propertyNames".into(), serde_json::Value::Object(ENV_VAR_NAME.keywords()));
        let mut value = ENV_VAR_VALUE.keywords();
        value.insert("type".into(), serde_json::json!("string"));
        k.insert("additionalProperties".into(), serde_json::Value::Object(value));
        k
    }
}
