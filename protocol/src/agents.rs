//! Kinds of sub-agent: what a `task` call may start. Two are built in
//! (`general`, `explore`); the operator may define more, or replace a
//! built-in one by name, in a file (`KILN_AGENT_KINDS`) that both the API
//! (which refuses a run naming a kind it does not know) and workers (which
//! start the children) read. A run narrows the kinds its `task` tool offers
//! with its `agents` field.
//!
//! The file, TOML (or JSON when its name ends in `.json`, same shape):
//!
//! ```toml
//! [kinds.reviewer]
//! description = "reviews a change and reports problems; never edits"
//! prompt = "You are a code reviewer. …"
//! tools = ["view", "grep", "glob", "ls", "bash"]
//! read_only = false
//! budget_share = 0.5
//! ```
//!
//! Parsing only; reading the file is the caller's.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::input;
use crate::rules::{NOT_BLANK_NO_NUL, Text};

/// Kinds one deployment may define (built-ins included).
pub const MAX_KINDS: usize = 32;
/// A kind's `description`, shown to the model in the `task` tool.
pub static KIND_DESCRIPTION: Text = Text::new(1, 1_000, NOT_BLANK_NO_NUL);
/// A kind's `prompt`, added to the child's system prompt.
pub static KIND_PROMPT: Text = Text::new(1, 32 * 1024, NOT_BLANK_NO_NUL);

/// One kind of sub-agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentKind {
    pub name: String,
    /// Shown to the model in the `task` tool's description.
    pub description: String,
    /// The child's role, added to its system prompt.
    pub prompt: String,
    /// The tools the child may call, names or patterns as in a run's
    /// `allowed_tools` (narrowed further by the parent's); `None`: every
    /// tool the parent may call.
    pub tools: Option<Vec<String>>,
    /// The child gets only tools that change nothing, whatever `tools` says.
    pub read_only: bool,
    /// The most of its parent's remaining budget (steps, tokens, cost) one
    /// child of this kind gets, as a fraction; several children of one step
    /// split what is left evenly and each gets no more than this.
    pub budget_share: f64,
}

/// Read-only: looks, never touches.
pub fn explore() -> AgentKind {
    AgentKind {
        name: "explore".into(),
        description: "read-only: searches and reads the workspace (view, grep, glob, ls) and reports what it found"
            .into(),
        prompt: "You are a read-only exploration sub-agent started by another agent. You cannot change files or run \
                 commands. Find what you were asked to find, then answer with a concise, self-contained report: the \
                 agent that started you sees only your final answer."
            .into(),
        // Its MCP tools too, of which being read-only lets through only
        // those a server the operator trusts marks read-only.
        tools: Some(["view", "grep", "glob", "ls", "mcp__*"].map(String::from).to_vec()),
        read_only: true,
        budget_share: 1.0,
    }
}

/// Everything the parent may do, for a self-contained piece of work.
pub fn general() -> AgentKind {
    AgentKind {
        name: GENERAL.into(),
        description: "general-purpose: may use every tool the parent may (files, bash) for a self-contained piece of \
                      work"
            .into(),
        prompt: "You are a sub-agent started by another agent for one self-contained piece of work. Do it, then \
                 answer with a concise summary of what you did and found: the agent that started you sees only your \
                 final answer."
            .into(),
        tools: None,
        read_only: false,
        budget_share: 1.0,
    }
}

/// The kind a `task` call without `agent` starts, when the run offers it.
pub const GENERAL: &str = "general";

/// The kinds of one deployment, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentKinds {
    kinds: BTreeMap<String, AgentKind>,
}

impl Default for AgentKinds {
    fn default() -> Self {
        Self::builtin()
    }
}

/// Why a kinds file is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindsError {
    #[error("not a valid agent kinds file: {0}")]
    Syntax(String),
    #[error("at most {MAX_KINDS} agent kinds (built-in ones included)")]
    TooMany,
    #[error("agent kind {name:?}: {why}")]
    Kind { name: String, why: String },
}

/// A kind as the file gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKind {
    description: String,
    prompt: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    budget_share: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    kinds: BTreeMap<String, RawKind>,
}

impl AgentKinds {
    /// `general` and `explore`.
    pub fn builtin() -> Self {
        AgentKinds { kinds: [general(), explore()].into_iter().map(|k| (k.name.clone(), k)).collect() }
    }

    /// No kinds: what a deployment without sub-agents offers (no `task` tool).
    pub fn none() -> Self {
        AgentKinds { kinds: BTreeMap::new() }
    }

    /// The built-in kinds with a TOML file's merged in (a kind of the same
    /// name replaces the built-in one).
    pub fn from_toml(text: &str) -> Result<Self, KindsError> {
        let file: File = toml::from_str(text).map_err(|e| KindsError::Syntax(e.message().to_owned()))?;
        Self::merged(file)
    }

    /// As [`AgentKinds::from_toml`], for a JSON file.
    pub fn from_json(text: &str) -> Result<Self, KindsError> {
        let file: File = serde_json::from_str(text).map_err(|e| KindsError::Syntax(e.to_string()))?;
        Self::merged(file)
    }

    fn merged(file: File) -> Result<Self, KindsError> {
        let mut kinds = Self::builtin().kinds;
        for (name, raw) in file.kinds {
            let kind = raw.check(&name).map_err(|why| KindsError::Kind { name: name.clone(), why })?;
            kinds.insert(name, kind);
            if kinds.len() > MAX_KINDS {
                return Err(KindsError::TooMany);
            }
        }
        Ok(AgentKinds { kinds })
    }

    pub fn get(&self, name: &str) -> Option<&AgentKind> {
        self.kinds.get(name)
    }

    /// Every kind's name, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Checks a run's `agents`: every name must be a kind of this deployment.
    pub fn check_run(&self, wanted: &[String]) -> Result<(), String> {
        match wanted.iter().find(|name| !self.kinds.contains_key(name.as_str())) {
            Some(unknown) => Err(format!(
                "agents: no agent kind named {unknown:?} here; the kinds are {}",
                self.names().collect::<Vec<_>>().join(", ")
            )),
            None => Ok(()),
        }
    }

    /// The kinds a run's `task` tool offers: all, or those its `agents`
    /// names (a name this deployment does not know is skipped: the API
    /// that took the run may have read another file).
    pub fn offered(&self, narrowing: Option<&[String]>) -> Vec<&AgentKind> {
        self.kinds.values().filter(|k| narrowing.is_none_or(|names| names.contains(&k.name))).collect()
    }
}

impl RawKind {
    fn check(self, name: &str) -> Result<AgentKind, String> {
        if !input::AGENT_KIND_NAME.accepts(name) {
            return Err(format!(
                "a kind's name must be 1 to {} letters, digits, _ or -",
                input::AGENT_KIND_NAME.max_chars
            ));
        }
        if !KIND_DESCRIPTION.accepts(&self.description) {
            return Err(format!("description must be 1 to {} characters, not blank", KIND_DESCRIPTION.max_chars));
        }
        if !KIND_PROMPT.accepts(&self.prompt) {
            return Err(format!("prompt must be 1 to {} characters, not blank", KIND_PROMPT.max_chars));
        }
        if let Some(tools) = &self.tools
            && !input::ALLOWED_TOOLS.accepts(tools, &input::TOOL_NAME)
        {
            return Err(format!(
                "tools must be a list of at most {} tool names or patterns (letters, digits, _, - and *)",
                input::ALLOWED_TOOLS.max_items
            ));
        }
        let budget_share = self.budget_share.unwrap_or(1.0);
        if !(budget_share > 0.0 && budget_share <= 1.0) {
            return Err("budget_share must be more than 0 and at most 1".into());
        }
        Ok(AgentKind {
            name: name.to_owned(),
            description: self.description,
            prompt: self.prompt,
            tools: self.tools,
            read_only: self.read_only,
            budget_share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_adds_kinds_and_may_replace_a_built_in_one() {
        let kinds = AgentKinds::from_toml(
            r#"
            [kinds.reviewer]
            description = "reviews"
            prompt = "You review."
            tools = ["view", "mcp__github__*"]
            budget_share = 0.25

            [kinds.explore]
            description = "my explore"
            prompt = "Look."
            read_only = true
            "#,
        )
        .unwrap();
        assert_eq!(kinds.names().collect::<Vec<_>>(), ["explore", "general", "reviewer"]);
        let reviewer = kinds.get("reviewer").unwrap();
        assert_eq!(reviewer.tools.as_deref(), Some(&["view".to_owned(), "mcp__github__*".to_owned()][..]));
        assert!(!reviewer.read_only);
        assert_eq!(reviewer.budget_share, 0.25);
        assert_eq!(kinds.get("explore").unwrap().description, "my explore");
        assert_eq!(kinds.get("explore").unwrap().tools, None);
        assert_eq!(kinds.get("general"), Some(&general()));
        let json = AgentKinds::from_json(r#"{"kinds":{"r":{"description":"d","prompt":"p"}}}"#).unwrap();
        assert_eq!(json.get("r").unwrap().budget_share, 1.0);
    }

    #[test]
    fn bad_files_are_refused_with_the_kind_named() {
        let kind = |body: &str| format!("[kinds.bad]\n{body}");
        for (text, says) in [
            (kind("description = \"d\"\nprompt = \"p\"\ntypo = 1"), "typo"),
            (kind("description = \"d\""), "prompt"),
            (kind("description = \" \"\nprompt = \"p\""), "description"),
            (kind("description = \"d\"\nprompt = \"p\"\ntools = [\"rm -rf\"]"), "tools"),
            (kind("description = \"d\"\nprompt = \"p\"\nbudget_share = 0"), "budget_share"),
            (kind("description = \"d\"\nprompt = \"p\"\nbudget_share = 1.5"), "budget_share"),
            ("[kinds.\"a b\"]\ndescription = \"d\"\nprompt = \"p\"".to_owned(), "name"),
            ("kinds = 3".to_owned(), "invalid type"),
        ] {
            let e = AgentKinds::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_run_narrows_to_known_kinds() {
        let kinds = AgentKinds::builtin();
        assert_eq!(kinds.check_run(&["explore".into()]), Ok(()));
        let e = kinds.check_run(&["explore".into(), "reviewer".into()]).unwrap_err();
        assert!(e.contains("\"reviewer\"") && e.contains("explore, general"), "{e}");
        let names = |k: Vec<&AgentKind>| k.into_iter().map(|k| k.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(kinds.offered(None)), ["explore", "general"]);
        assert_eq!(names(kinds.offered(Some(&["explore".into(), "gone".into()]))), ["explore"]);
        assert!(kinds.offered(Some(&[])).is_empty());
    }
}
