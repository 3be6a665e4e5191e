//! The kinds of sub-agent a `task` call may start (defined in
//! [`kiln_protocol::agents`]: the built-in ones and the operator's), what a
//! run's `task` tool offers of them, and the tools a child of a kind gets.

use kiln_protocol::Run;
pub use kiln_protocol::agents::{AgentKind, AgentKinds, GENERAL};

use crate::agent::name_matches;
pub use crate::tools::task::default_kind;
use crate::tools::{Registry, task};

/// The kinds `run`'s `task` tool offers: the deployment's, narrowed by the
/// run's `agents`.
pub fn offered<'k>(kinds: &'k AgentKinds, run: &Run) -> Vec<&'k AgentKind> {
    kinds.offered(run.agents.as_deref())
}

/// The child's `allowed_tools`: the kind's tools, narrowed by the parent's
/// list (a child never gets a tool its parent may not use) and, for a
/// read-only kind, by what `tools` says changes nothing. `None`: every tool.
pub fn allowed_tools(kind: &AgentKind, parent: Option<&[String]>, tools: &Registry) -> Option<Vec<String>> {
    if kind.tools.is_none() && !kind.read_only {
        return parent.map(<[String]>::to_vec);
    }
    let matches_any = |patterns: &[String], name: &str| patterns.iter().any(|p| name_matches(p, name));
    let names = tools
        .names()
        .filter(|name| kind.tools.as_deref().is_none_or(|own| matches_any(own, name)))
        .filter(|name| parent.is_none_or(|parent| matches_any(parent, name)))
        // A read-only child may start no child that could change things.
        .filter(|name| !kind.read_only || (*name != task::NAME && tools.get(name).is_some_and(|t| !t.is_mutating())))
        .map(str::to_owned)
        .collect();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(tools: Option<&[&str]>, read_only: bool) -> AgentKind {
        AgentKind {
            tools: tools.map(|t| t.iter().map(|s| (*s).to_owned()).collect()),
            read_only,
            ..kiln_protocol::agents::general()
        }
    }

    #[test]
    fn a_child_never_gets_a_tool_its_parent_may_not_use() {
        let tools = Registry::standard();
        let explore = kiln_protocol::agents::explore();
        let general = kiln_protocol::agents::general();
        let parent = vec!["view".to_owned(), "bash".to_owned()];
        assert_eq!(allowed_tools(&explore, Some(&parent), &tools), Some(vec!["view".to_owned()]));
        assert_eq!(allowed_tools(&explore, None, &tools).map(|t| t.len()), Some(4));
        assert_eq!(allowed_tools(&general, Some(&parent), &tools), Some(parent.clone()));
        assert_eq!(allowed_tools(&general, None, &tools), None);
        // Patterns on either side.
        let parent = vec!["*".to_owned()];
        let got = allowed_tools(&kind(Some(&["gr*", "bash"]), false), Some(&parent), &tools);
        assert_eq!(got, Some(vec!["bash".to_owned(), "grep".to_owned()]));
    }

    #[test]
    fn a_read_only_kind_gets_only_tools_that_change_nothing() {
        let tools = Registry::standard();
        let got = allowed_tools(&kind(Some(&["bash", "view", "edit"]), true), None, &tools);
        assert_eq!(got, Some(vec!["view".to_owned()]));
        let all = allowed_tools(&kind(None, true), None, &tools).unwrap();
        assert!(!all.iter().any(|t| ["bash", "edit", "write", "task"].contains(&t.as_str())), "{all:?}");
        assert!(all.contains(&"grep".to_owned()));
    }

    #[test]
    fn the_default_kind_is_general_when_offered() {
        let kinds = AgentKinds::builtin();
        assert_eq!(default_kind(&kinds.offered(None)).map(|k| k.name.as_str()), Some(GENERAL));
        let only = ["explore".to_owned()];
        assert_eq!(default_kind(&kinds.offered(Some(&only))).map(|k| k.name.as_str()), Some("explore"));
        assert_eq!(default_kind(&[]), None);
    }
}
