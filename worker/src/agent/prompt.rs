//! The system prompt, kept in its own file so it can be read and reviewed as
//! text.

const SYSTEM_PROMPT: &str = include_str!("system_prompt.md");

pub fn system_prompt() -> String {
    SYSTEM_PROMPT.to_owned()
}
