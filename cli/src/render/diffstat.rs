//! A run's change as a person reads it: a diffstat (`kiln diff --stat`,
//! the end of `kiln run --follow`), the `changes.captured` event in words,
//! and the patch with its lines coloured on a terminal.

use console::style;
use kiln_protocol::changes::{ChangeTotals, FileChange, FileStatus, RunChanges};

use super::printable::printable;

/// The widest `+++---` bar, as git's diffstat keeps within 80 columns.
const MAX_BAR: u64 = 40;

/// One line per file (`path | 12 ++++--`, `Bin` for a binary file) and the
/// summary line, as `git diff --stat` prints them; `colour` paints the bars.
pub fn diffstat(changes: &RunChanges, colour: bool) -> Vec<String> {
    let names: Vec<String> = changes.files.iter().map(display_name).collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let most = changes.files.iter().map(|f| f.additions + f.deletions).max().unwrap_or(0);
    let digits = most.to_string().len();
    let mut lines: Vec<String> = changes
        .files
        .iter()
        .zip(&names)
        .map(|(file, name)| {
            let pad = " ".repeat(width - name.chars().count());
            if file.binary {
                return format!(" {name}{pad} | {:>digits$}", "Bin");
            }
            let count = file.additions + file.deletions;
            format!(" {name}{pad} | {count:>digits$} {}", bar(file, most, colour))
        })
        .collect();
    lines.push(format!(" {}", summary(&changes.totals)));
    lines
}

/// `path`, or `old => new` for a rename or copy; cleaned for a terminal
/// (file names come from the repository, which may be hostile).
fn display_name(file: &FileChange) -> String {
    match (&file.old_path, file.status) {
        (Some(old), FileStatus::Renamed | FileStatus::Copied) => printable(&format!("{old} => {}", file.path)),
        _ => printable(&file.path),
    }
}

/// `+` and `-` in proportion, scaled down so the widest is [`MAX_BAR`].
fn bar(file: &FileChange, most: u64, colour: bool) -> String {
    let scale = |n: u64| if most <= MAX_BAR { n } else { (n * MAX_BAR).div_ceil(most) };
    let plus = "+".repeat(usize::try_from(scale(file.additions)).unwrap_or(0));
    let minus = "-".repeat(usize::try_from(scale(file.deletions)).unwrap_or(0));
    if colour { format!("{}{}", style(plus).green(), style(minus).red()) } else { format!("{plus}{minus}") }
}

/// `3 files changed, 10 insertions(+), 2 deletions(-)`.
pub fn summary(totals: &ChangeTotals) -> String {
    let files = if totals.files == 1 { "1 file changed".to_owned() } else { format!("{} files changed", totals.files) };
    let mut parts = vec![files];
    if totals.additions > 0 || totals.deletions == 0 {
        parts.push(format!("{} insertion{}(+)", totals.additions, if totals.additions == 1 { "" } else { "s" }));
    }
    if totals.deletions > 0 {
        parts.push(format!("{} deletion{}(-)", totals.deletions, if totals.deletions == 1 { "" } else { "s" }));
    }
    parts.join(", ")
}

/// The `changes.captured` event in words.
pub fn captured(totals: &ChangeTotals, too_large: bool) -> String {
    if totals.files == 0 {
        return "no files changed".to_owned();
    }
    let what = format!("changed {}", summary(totals).replacen(" changed", "", 1));
    if too_large {
        format!("{what}; the patch is over this deployment's limit (KILN_MAX_PATCH_MB): only its summary was kept")
    } else {
        what
    }
}

/// A patch's lines for a terminal: each made printable (a patch carries
/// the repository's bytes, escapes included) and coloured as git colours
/// them: headers bold, hunks cyan, additions green, deletions red.
pub fn coloured_patch(patch: &[u8]) -> String {
    let text = String::from_utf8_lossy(patch);
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for line in text.split_inclusive('\n') {
        let line = printable(line.trim_end_matches('\n'));
        let painted = if line.starts_with("diff --git") || line.starts_with("+++ ") || line.starts_with("--- ") {
            style(line).bold().to_string()
        } else if line.starts_with("@@") {
            style(line).cyan().to_string()
        } else if line.starts_with('+') {
            style(line).green().to_string()
        } else if line.starts_with('-') {
            style(line).red().to_string()
        } else {
            line
        };
        out.push_str(&painted);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, status: FileStatus, additions: u64, deletions: u64, binary: bool) -> FileChange {
        FileChange { path: path.into(), old_path: None, status, additions, deletions, binary }
    }

    fn changes(files: Vec<FileChange>) -> RunChanges {
        let totals = ChangeTotals {
            files: files.len() as u64,
            additions: files.iter().map(|f| f.additions).sum(),
            deletions: files.iter().map(|f| f.deletions).sum(),
        };
        RunChanges {
            run_id: uuid::Uuid::nil(),
            scope: kiln_protocol::changes::ChangeScope::Run,
            base_commit: None,
            files,
            totals,
            patch_bytes: 0,
            too_large: false,
        }
    }

    #[test]
    fn a_diffstat_reads_like_gits() {
        let mut renamed = file("src/new.rs", FileStatus::Renamed, 1, 1, false);
        renamed.old_path = Some("src/old.rs".into());
        let c = changes(vec![
            file("README.md", FileStatus::Modified, 3, 1, false),
            file("logo.png", FileStatus::Added, 0, 0, true),
            renamed,
        ]);
        assert_eq!(
            diffstat(&c, false),
            [
                " README.md                | 4 +++-",
                " logo.png                 | Bin",
                " src/old.rs => src/new.rs | 2 +-",
                " 3 files changed, 4 insertions(+), 2 deletions(-)",
            ]
        );
    }

    #[test]
    fn long_bars_are_scaled_and_hostile_names_cleaned() {
        let c = changes(vec![file("a\u{1b}[2Jb", FileStatus::Added, 400, 0, false)]);
        let lines = diffstat(&c, false);
        assert_eq!(lines[0], format!(" ab | 400 {}", "+".repeat(40)));
        assert_eq!(lines[1], " 1 file changed, 400 insertions(+)");
        assert_eq!(captured(&c.totals, false), "changed 1 file, 400 insertions(+)");
        assert_eq!(captured(&ChangeTotals::default(), false), "no files changed");
    }

    #[test]
    fn a_patch_is_printed_without_the_escapes_it_carries() {
        let out = coloured_patch(b"+x\x1b]52;c;aGk=\x07y\n-z\n");
        assert!(!out.contains("]52;"), "{out:?}");
        assert!(out.contains("xy") && out.contains('z'), "{out:?}");
    }
}
