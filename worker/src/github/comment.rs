//! Run text made inert for GitHub comments and pull request bodies. Errors
//! and answers come from the model, the commands it ran and the services it
//! reached; posted as written they could mention people (`@user`), address
//! Kiln again (`@kiln`, `/kiln`) under the account Kiln posts as, or open a
//! code block or HTML that swallows the rest of Kiln's own text. Everything
//! dynamic Kiln posts goes through [`inline`] or [`quote`].

/// Longest run text quoted in a comment (GitHub caps bodies at 65536).
const MAX_QUOTED_CHARS: usize = 20_000;
/// Follows every `@`: GitHub links no mention across it, and it shows as nothing.
const ZERO_WIDTH_SPACE: char = '\u{200b}';
/// Characters that can start inline Markdown or HTML (`&` an entity such as
/// `&#64;`); a backslash before each shows it as itself.
const MARKUP: &[char] = &['\\', '`', '*', '_', '[', ']', '<', '>', '!', '~', '|', '&'];

/// `text` for the end of a sentence (`failed: {text}`): one line, bounded,
/// shown as written but with no markup, no mention and no line of its own
/// (so no `/kiln` at a line's start, no fence, no heading).
pub fn inline(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(flat.len());
    for c in flat.chars().take(MAX_QUOTED_CHARS) {
        if MARKUP.contains(&c) {
            out.push('\\');
        }
        push_unmentioned(&mut out, c);
    }
    out
}

/// `text` as a Markdown quote, bounded: every line starts with `> ` (Kiln's
/// webhook skips quoted lines, and a code block or HTML opened inside ends
/// with the quote), and no `@` mentions anyone.
pub fn quote(text: &str) -> String {
    let text: String = text.chars().take(MAX_QUOTED_CHARS).collect();
    if text.trim().is_empty() {
        return "> (no answer)".into();
    }
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("> ");
        line.chars().for_each(|c| push_unmentioned(&mut out, c));
    }
    out
}

fn push_unmentioned(out: &mut String, c: char) {
    out.push(c);
    if c == '@' {
        out.push(ZERO_WIDTH_SPACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_text_stays_on_its_line_without_markup_or_mentions() {
        let error = "boom @someone\n/kiln do more\n```\n<img src=x> [a](b) &#64;x";
        assert_eq!(inline(error), "boom @\u{200b}someone /kiln do more \\`\\`\\` \\<img src=x\\> \\[a\\](b) \\&#64;x");
        assert_eq!(inline("the worker running this run was lost"), "the worker running this run was lost");
    }

    #[test]
    fn quotes_prefix_every_line_and_mention_nobody() {
        assert_eq!(quote("hi @kiln\n\n```\n/kiln go"), "> hi @\u{200b}kiln\n> \n> ```\n> /kiln go");
        assert_eq!(quote(" \n"), "> (no answer)");
        assert_eq!(quote(&"x".repeat(MAX_QUOTED_CHARS + 5)).len(), MAX_QUOTED_CHARS + 2);
    }
}
