//! The approval gate: whether a tool call may run. Calls outside the run's
//! `allowed_tools` are refused; calls its approval mode covers wait, with
//! the run in `awaiting_approval`, for a person's decision.

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{ApprovalMode, Run};
use kiln_store::{Approval, Decision, Lease, McpCall, Store};

use super::AgentError;
use super::control::Control;
use super::tool_call::ToolCall;
use crate::event_sink::EventSink;
use crate::mcp::names::server_and_tool;
use crate::tools::{Registry, ToolOutcome};

/// How often a run waiting for approval re-reads the decision.
const APPROVAL_POLL: Duration = Duration::from_secs(1);

/// What the gate needs of the run.
pub(super) struct Gate<'a> {
    pub store: &'a Store,
    pub lease: &'a Lease,
    pub run: &'a Run,
    /// The agent's tools as they are this step.
    pub tools: Arc<Registry>,
    /// Only tools that change nothing are allowed.
    pub read_only: bool,
    /// Woken when a decision is stored.
    pub control: Arc<Control>,
}

/// What the gate said about a call.
pub(super) enum Clearance {
    /// It needs nobody's approval.
    Free,
    /// A person approved it.
    Approved,
    /// It does not run: the tool is not allowed, or a person denied it.
    Refused { outcome: ToolOutcome, asked: bool },
}

impl Clearance {
    /// Whether a person was asked (the run went to `awaiting_approval`).
    fn asked(&self) -> bool {
        matches!(self, Clearance::Approved | Clearance::Refused { asked: true, .. })
    }

    /// The result a refused call gets instead of running.
    pub fn refusal(self) -> Option<ToolOutcome> {
        match self {
            Clearance::Refused { outcome, .. } => Some(outcome),
            Clearance::Free | Clearance::Approved => None,
        }
    }
}

impl Gate<'_> {
    /// Whether the run may call `name` at all (its `allowed_tools`, whose
    /// entries may be patterns such as `mcp__github__*`; for a read-only
    /// agent, only a tool that changes nothing as it is listed now).
    pub fn allows(&self, name: &str) -> bool {
        let listed =
            self.run.allowed_tools.as_ref().is_none_or(|allowed| allowed.iter().any(|t| name_matches(t, name)));
        listed && (!self.read_only || self.tools.get(name).is_some_and(|t| !t.is_mutating()))
    }

    /// Whether the run's approval mode makes a call of `name` wait for a person.
    pub fn needs_approval(&self, name: &str) -> bool {
        let mutating = self.tools.get(name).is_none_or(|t| t.is_mutating());
        match self.run.approval {
            ApprovalMode::Never => false,
            ApprovalMode::Mutating => mutating,
            ApprovalMode::Always => true,
        }
    }

    /// Whether `call` may run. The caller puts the run back to `running`
    /// ([`Gate::release`]) once its batch is cleared.
    pub async fn clear(&self, events: &mut EventSink, call: &ToolCall) -> Result<Clearance, AgentError> {
        if !self.allows(&call.name) {
            let refusal = ToolOutcome::error(format!("the tool {:?} is not available in this run", call.name));
            return Ok(Clearance::Refused { outcome: refusal, asked: false });
        }
        if !self.needs_approval(&call.name) {
            return Ok(Clearance::Free);
        }
        // The store writes `approval.requested` itself: what is buffered first.
        events.commit().await?;
        let tool = self.tools.get(&call.name).cloned();
        let mcp = tool.as_ref().and_then(|t| t.mcp_origin()).map(|m| McpCall { tool: shown(m.tool), ..m });
        let decision = match self.store.request_approval(self.lease, &call.id, &call.name, &call.arguments, mcp).await?
        {
            Approval::Decided(decision) => decision,
            Approval::Waiting => self.wait_for_decision(call).await?,
            Approval::IdTaken => {
                let refusal = ToolOutcome::error(format!(
                    "refused: the call id {:?} was already used in this run for another call",
                    call.id
                ));
                return Ok(Clearance::Refused { outcome: refusal, asked: false });
            }
        };
        if decision.approved {
            return Ok(Clearance::Approved);
        }
        let why = decision.reason.map(|r| format!(": {r}")).unwrap_or_default();
        Ok(Clearance::Refused { outcome: ToolOutcome::error(format!("the user denied this call{why}")), asked: true })
    }

    /// Once a batch a person was asked about is cleared, puts the run back
    /// to `running` and marks the approved calls as started: a takeover
    /// from here on cannot know whether they ran, and one before this lets
    /// them through the gate again (see `resume`).
    pub async fn release(&self, batch: &[ToolCall], clearances: &[Clearance]) -> Result<(), AgentError> {
        if !clearances.iter().any(Clearance::asked) {
            return Ok(());
        }
        let starting: Vec<String> = batch
            .iter()
            .zip(clearances)
            .filter(|(_, c)| matches!(c, Clearance::Approved))
            .map(|(call, _)| call.id.clone())
            .collect();
        self.store.resume_after_approval(self.lease, &starting).await?;
        Ok(())
    }

    /// Waits for a person's decision; woken by NOTIFY, with polling in case
    /// the notification was missed. Cancellation and the wall clock still
    /// apply (the run task stops this future).
    async fn wait_for_decision(&self, call: &ToolCall) -> Result<Decision, AgentError> {
        loop {
            tokio::select! {
                _ = self.control.wait() => {}
                _ = tokio::time::sleep(APPROVAL_POLL) => {}
            }
            match self.store.approval_decision(self.run.id, &call.id, &call.name, &call.arguments).await {
                Ok(Some(decision)) => return Ok(decision),
                Ok(None) => {}
                // The wait is for a person, who may take hours: a database
                // restart meanwhile is no reason to end the run. The lease
                // runs out if the database stays away (the heartbeat).
                Err(e) if e.is_unavailable() => tracing::warn!(error = %e, "reading the decision failed; waiting on"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Characters of an MCP server's own name for a tool that an approval
/// request shows: the server chose it, and the event is kept.
const MAX_SHOWN_TOOL_CHARS: usize = 256;

/// `tool` cut to [`MAX_SHOWN_TOOL_CHARS`].
fn shown(tool: &str) -> &str {
    match tool.char_indices().nth(MAX_SHOWN_TOOL_CHARS) {
        Some((at, _)) => &tool[..at],
        None => tool,
    }
}

/// Whether the tool `name` matches `pattern` (an `allowed_tools` entry or
/// an agent kind's tool pattern).
///
/// A pattern that names an MCP server's tools (`mcp__<server>__<tool>`)
/// is matched part by part at the separator (`crate::mcp::names`): its
/// server part against the name's server, its tool part against the
/// name's tool, so a `*` never runs across the separator and
/// `mcp__github__*` is the tools of `github` and of no other server. Any
/// other pattern (`view`, `*`, `mcp__*`) is matched against the whole name.
pub(crate) fn name_matches(pattern: &str, name: &str) -> bool {
    match server_and_tool(pattern) {
        Some((server_pattern, Some(tool_pattern))) => match server_and_tool(name) {
            Some((server, Some(tool))) => glob_matches(server_pattern, server) && glob_matches(tool_pattern, tool),
            _ => false,
        },
        _ => glob_matches(pattern, name),
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself. Tool names
/// are ASCII letters, digits, `_` and `-`, so nothing else needs escaping.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    // No `*`: the whole name.
    let Some(first) = parts.next() else { return false };
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else { return rest.is_empty() };
    for piece in middle {
        // The leftmost place a piece fits leaves the most for the others.
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::name_matches;

    #[test]
    fn patterns_match_whole_names_with_star_for_any_run() {
        assert!(name_matches("view", "view"));
        assert!(!name_matches("view", "viewer"));
        assert!(!name_matches("view", "vie"));
        assert!(name_matches("mcp__demo__*", "mcp__demo__add"));
        assert!(name_matches("mcp__demo__*", "mcp__demo__"));
        assert!(!name_matches("mcp__demo__*", "mcp__demo2__add"));
        assert!(!name_matches("mcp__demo__*", "bash"));
        assert!(name_matches("*", "bash"));
        assert!(name_matches("mcp__*__add", "mcp__demo__add"));
        assert!(!name_matches("mcp__*__add", "mcp__demo__add2"));
        assert!(name_matches("*_add", "mcp__demo__add"));
        assert!(name_matches("a*b*c", "abc"));
        assert!(name_matches("a*b*c", "axxbyyc"));
        assert!(!name_matches("a*b*c", "axxcyyb"));
        // The suffix may not reuse what a middle piece consumed.
        assert!(!name_matches("ab*b", "ab"));
        assert!(name_matches("a**", "a"));
    }

    #[test]
    fn a_pattern_naming_a_server_matches_that_servers_tools_only() {
        // A `*` in the server part stays in the server part: the tool `b__add`
        // of server `a` is not a tool named `add` (a whole-name match said so).
        assert!(!name_matches("mcp__*__add", "mcp__a__b__add"));
        assert!(!name_matches("mcp__*__add", "mcp__a_b__x__add"));
        assert!(name_matches("mcp__*__add", "mcp__a_b__add"));
        // The first `__` is the separator: `mcp__github___x` is github's
        // tool `_x`, and `mcp__github__x__y` its tool `x__y` (no server may
        // be called `github_` or `github__x`).
        assert!(name_matches("mcp__github__*", "mcp__github___x"));
        assert!(name_matches("mcp__github__x__*", "mcp__github__x__y"));
        assert!(!name_matches("mcp__github__*", "mcp__github_x__y"));
        assert!(!name_matches("mcp__my__*", "mcp__my_server__add"));
        assert!(name_matches("mcp__my_server__*", "mcp__my_server__add"));
        assert!(name_matches("mcp__git*__*", "mcp__github__create"));
        // A name whose server was cut (no separator) matches no pattern
        // that names a server; whole-name patterns match it.
        assert!(!name_matches("mcp__aaaaaaaa__*", "mcp__aaaaaaaa_0123abcd"));
        assert!(!name_matches("mcp__*__*", "mcp__aaaaaaaa_0123abcd"));
        assert!(name_matches("mcp__*", "mcp__aaaaaaaa_0123abcd"));
        assert!(name_matches("*", "mcp__github__x"));
        assert!(!name_matches("mcp__github__*", "bash"));
    }
}
