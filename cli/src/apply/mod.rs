//! `kiln apply RUN`: a run's change applied to a checkout on this machine,
//! three-way, so a checkout that moved on since the run's base still takes
//! it where the lines allow.
//!
//! The checkout is written only when the whole change goes in without a
//! conflict ([`trial`]); otherwise it is left exactly as it was and the
//! conflicting files are named. A checkout without the run's base commit
//! is refused with the command that fetches it: a three-way apply needs
//! the base's blobs, and without them git would only half manage.

mod git;
mod trial;

use std::path::{Path, PathBuf};

use kiln_protocol::Run;
use kiln_protocol::changes::RunChanges;

use trial::Trial;

/// Why a change was not applied. Each leaves the checkout untouched.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(
        "{dir} is not a git checkout; the run's change applies to a checkout of its base commit {base}:\n  \
         {clone}"
    )]
    NotACheckout { dir: String, base: String, clone: String },
    #[error(
        "the checkout at {dir} does not have the run's base commit {base}; fetch it, then run this again:\n  \
         {fetch}"
    )]
    MissingBase { dir: String, base: String, fetch: String },
    #[error("the run's change conflicts with the checkout in: {}\nnothing was changed", .0.join(", "))]
    Conflicts(Vec<String>),
    #[error("git apply refused the run's change (nothing was changed):\n{0}")]
    Refused(String),
    #[error("the run's change names a path outside the checkout: {0:?}; nothing was changed")]
    Outside(String),
    #[error("{0}")]
    Local(String),
}

/// What was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The run changed no files.
    Nothing,
    /// Applied at this checkout's top (staged, for a git checkout).
    Into { top: PathBuf, staged: bool },
}

/// Applies `patch` (the run's change, described by `changes`) to the
/// checkout containing `dir`.
pub fn apply(run: &Run, changes: &RunChanges, patch: &[u8], dir: &Path) -> Result<Applied, ApplyError> {
    if changes.files.is_empty() {
        return Ok(Applied::Nothing);
    }
    let Some(top) = git::answer(dir, &["rev-parse", "--show-toplevel"])?.map(PathBuf::from) else {
        return match &changes.base_commit {
            Some(base) => Err(not_a_checkout(run, base, dir)),
            // A run without a repository made only new files: they go in
            // any directory, all or none (git apply's own rule).
            None => plain_apply(dir, patch),
        };
    };
    if let Some(base) = &changes.base_commit {
        let object = format!("{base}^{{commit}}");
        if git::answer(&top, &["cat-file", "-e", &object])?.is_none() {
            return Err(missing_base(run, base, &top));
        }
    }
    let mut paths = Vec::new();
    for file in &changes.files {
        for path in std::iter::once(&file.path).chain(file.old_path.as_ref()) {
            if !trial::inside(&top, path) {
                return Err(ApplyError::Outside(path.clone()));
            }
            paths.push(path.as_str());
        }
    }
    match trial::three_way(&top, &paths, patch)? {
        Trial::Clean => {}
        Trial::Conflicts(files) => return Err(ApplyError::Conflicts(files)),
        Trial::Refused(said) => return Err(ApplyError::Refused(said)),
    }
    let out = git::run(&top, &["apply", "--3way", "--whitespace=nowarn"], Some(patch))?;
    if !out.status.success() {
        // The checkout changed between the dry run and now.
        return Err(ApplyError::Local(format!(
            "git apply failed after its dry run passed (did the checkout change meanwhile?):\n{}",
            git::said(&out)
        )));
    }
    Ok(Applied::Into { top, staged: true })
}

fn plain_apply(dir: &Path, patch: &[u8]) -> Result<Applied, ApplyError> {
    let out = git::run(dir, &["apply", "--whitespace=nowarn"], Some(patch))?;
    if !out.status.success() {
        return Err(ApplyError::Refused(git::said(&out)));
    }
    Ok(Applied::Into { top: dir.to_path_buf(), staged: false })
}

/// Where the run's repository is, for the commands printed: its URL, or
/// a placeholder a person fills in.
fn repo_url(run: &Run) -> String {
    run.repo.as_ref().map_or_else(|| "<the run's repository URL>".to_owned(), |r| shell_word(&r.url))
}

fn missing_base(run: &Run, base: &str, top: &Path) -> ApplyError {
    let dir = top.display().to_string();
    let fetch = format!("git -C {} fetch {} {base}", shell_word(&dir), repo_url(run));
    ApplyError::MissingBase { dir, base: base.to_owned(), fetch }
}

fn not_a_checkout(run: &Run, base: &str, dir: &Path) -> ApplyError {
    let dir = dir.display().to_string();
    let clone = format!("git clone {url} {d} && git -C {d} checkout {base}", url = repo_url(run), d = shell_word(&dir));
    ApplyError::NotACheckout { dir, base: base.to_owned(), clone }
}

/// `s` quoted for a POSIX shell when it needs it, so a printed command can
/// be pasted as it is.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-:@%+=,".contains(c));
    if plain { s.to_owned() } else { format!("'{}'", s.replace('\'', r"'\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_commands_survive_a_shell() {
        assert_eq!(shell_word("/home/me/src/app"), "/home/me/src/app");
        assert_eq!(shell_word("https://git.example/a.git"), "https://git.example/a.git");
        assert_eq!(shell_word("my dir"), "'my dir'");
        assert_eq!(shell_word("it's; rm -rf ~"), r"'it'\''s; rm -rf ~'");
    }
}
