//! The kinds of sub-agent a `task` call may start. A kind narrows the
//! child's tools and gives it its own role in the system prompt.

/// One kind of sub-agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentKind {
    pub name: &'static str,
    /// Shown to the model in the `task` tool's description.
    pub description: &'static str,
    /// The tools the child may call (narrowed further by the parent's
    /// `allowed_tools`); `None`: every tool the parent may call, except
    /// `task` past the depth limit.
    pub tools: Option<&'static [&'static str]>,
    /// The child's role, appended to the system prompt.
    pub role: &'static str,
}

/// Read-only: looks, never touches. Children of this kind can run in
/// parallel with anything.
pub const EXPLORE: AgentKind = AgentKind {
    name: "explore",
    description: "read-only: searches and reads the workspace (view, grep, glob, ls) and reports what it found",
    tools: Some(&["view", "grep", "glob", "ls"]),
    role: "You are a read-only exploration sub-agent started by another agent. You cannot change files or run \
           commands. Find what you were asked to find, then answer with a concise, self-contained report: the \
           agent that started you sees only your final answer.",
};

/// Everything the parent may do, for a self-contained piece of work.
pub const GENERAL: AgentKind = AgentKind {
    name: "general",
    description: "general-purpose: may use every tool the parent may (files, bash) for a self-contained piece of work",
    tools: None,
    role: "You are a sub-agent started by another agent for one self-contained piece of work. Do it, then answer \
           with a concise summary of what you did and found: the agent that started you sees only your final answer.",
};

/// Every kind, the default first.
pub const KINDS: [AgentKind; 2] = [GENERAL, EXPLORE];

/// The kind called `name`; `None` when there is none.
pub fn find(name: &str) -> Option<&'static AgentKind> {
    KINDS.iter().find(|k| k.name == name)
}

impl AgentKind {
    /// The child's `allowed_tools`: the kind's tools, narrowed by the
    /// parent's list (a child never gets a tool its parent may not use).
    pub fn allowed_tools(&self, parent: Option<&[String]>) -> Option<Vec<String>> {
        match (self.tools, parent) {
            (Some(own), Some(parent)) => {
                Some(own.iter().filter(|t| parent.iter().any(|p| p == *t)).map(|t| (*t).to_owned()).collect())
            }
            (Some(own), None) => Some(own.iter().map(|t| (*t).to_owned()).collect()),
            (None, parent) => parent.map(<[String]>::to_vec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_never_gets_a_tool_its_parent_may_not_use() {
        let parent = vec!["view".to_owned(), "bash".to_owned()];
        assert_eq!(EXPLORE.allowed_tools(Some(&parent)), Some(vec!["view".to_owned()]));
        assert_eq!(EXPLORE.allowed_tools(None).map(|t| t.len()), Some(4));
        assert_eq!(GENERAL.allowed_tools(Some(&parent)), Some(parent.clone()));
        assert_eq!(GENERAL.allowed_tools(None), None);
        assert_eq!(find("explore"), Some(&EXPLORE));
        assert_eq!(find("nope"), None);
    }
}
