//! What a comment addressing Kiln asks for, beyond "run": the options of
//! the `/kiln` command (or of an `@kiln` mention), read from the text right
//! after it on its line.
//!
//! - `/kiln --attempts N <task>` (or `--attempts=N`): run the task as a
//!   group of N attempts (issue 29). The number is checked against the
//!   deployment's maximum by the route, which answers an out-of-range one
//!   with a failed run whose report on the issue says why.
//! - `/kiln select K`: make attempt K of the latest group asked for on this
//!   issue or pull request its choice, which opens its pull request.
//!
//! Anything else is the task, as before: `/kiln select the fastest parser`
//! is a run (a number must follow `select`).

/// What a comment asks Kiln for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A run; `attempts` as asked (`None`: not asked; `Err`: a value that
    /// is not a number, with the reason).
    Run { attempts: Option<Result<u32, String>> },
    /// Choose attempt K of the latest group.
    Select(u32),
}

/// The command in `body`, which addresses `handle` (lower-case): the words
/// after the first `/handle` that starts the comment, or else after the
/// first `@handle` outside a quoted line.
pub fn parse(body: &str, handle: &str) -> Command {
    let args = arguments(body, handle).unwrap_or_default();
    let mut words = args.split_whitespace();
    let first = words.next().unwrap_or_default();
    if first.eq_ignore_ascii_case("select")
        && let Some(number) = words.next().filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
    {
        // Digits only: a number too large for u32 is no attempt either.
        return Command::Select(number.parse().unwrap_or(u32::MAX));
    }
    let lower = first.to_ascii_lowercase();
    let value = match lower.strip_prefix("--attempts") {
        Some("") => Some(words.next().unwrap_or_default()),
        Some(rest) => rest.strip_prefix('=').or(Some(rest)),
        None => None,
    };
    let attempts = value
        .map(|v| v.parse::<u32>().map_err(|_| format!("`--attempts` takes a number of attempts, not {:?}", clip(v))));
    Command::Run { attempts }
}

/// The rest of the line after the command or the mention.
fn arguments<'a>(body: &'a str, handle: &str) -> Option<&'a str> {
    let trimmed = body.trim_start();
    let command = format!("/{handle}");
    if trimmed.len() >= command.len() && trimmed[..command.len()].eq_ignore_ascii_case(&command) {
        return trimmed[command.len()..].lines().next();
    }
    let mention = format!("@{handle}");
    body.lines().filter(|line| !line.trim_start().starts_with('>')).find_map(|line| {
        // ASCII lower-casing keeps byte offsets, so slicing stays valid.
        let lower = line.to_ascii_lowercase();
        lower.find(&mention).map(|at| &line[at + mention.len()..])
    })
}

/// A word of the comment, short enough to quote back.
fn clip(word: &str) -> String {
    word.chars().filter(|c| !c.is_control()).take(20).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(attempts: Option<Result<u32, String>>) -> Command {
        Command::Run { attempts }
    }

    #[test]
    fn attempts_follow_the_command_or_the_mention() {
        assert_eq!(parse("/kiln --attempts 3 fix the bug", "kiln"), run(Some(Ok(3))));
        assert_eq!(parse("/Kiln --attempts=2\nmore text", "kiln"), run(Some(Ok(2))));
        assert_eq!(parse("Hey @kiln --attempts 4 please", "kiln"), run(Some(Ok(4))));
        assert_eq!(parse("/kiln fix it --attempts 3", "kiln"), run(None));
        assert_eq!(parse("/kiln fix the bug", "kiln"), run(None));
        assert_eq!(parse("> @kiln --attempts 2\n@kiln go", "kiln"), run(None));
        assert_eq!(parse("/kiln --attempts 9", "kiln"), run(Some(Ok(9))));
        assert!(
            matches!(parse("/kiln --attempts many", "kiln"), Command::Run { attempts: Some(Err(e)) } if e.contains("\"many\""))
        );
        assert!(matches!(parse("/kiln --attempts", "kiln"), Command::Run { attempts: Some(Err(_)) }));
    }

    #[test]
    fn select_takes_a_number_and_anything_else_is_a_task() {
        assert_eq!(parse("/kiln select 2", "kiln"), Command::Select(2));
        assert_eq!(parse("  /kiln SELECT 3 thanks", "kiln"), Command::Select(3));
        assert_eq!(parse("@kiln select 1", "kiln"), Command::Select(1));
        assert_eq!(parse("/kiln select 99999999999", "kiln"), Command::Select(u32::MAX));
        assert_eq!(parse("/kiln select the fastest parser", "kiln"), run(None));
        assert_eq!(parse("/kiln select -1", "kiln"), run(None));
    }
}
