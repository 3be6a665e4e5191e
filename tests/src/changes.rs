//! Runs that end with a change, for the tests of what serves and applies
//! it (the API's `/patch` and `/changes`, `kiln diff`, `kiln apply`, the web
//! view's panel) without a model: the change is made by real git on a
//! clone of the run's repository, and saved with the store's own function
//! under the run's lease, as the worker saves its capture.

use std::path::Path;
use std::time::Duration;

use kiln_protocol::changes::{ChangeScope, ChangeTotals, FileChange, FileStatus};
use kiln_protocol::{CreateRun, EventBody, RepoSpec};
use kiln_store::CapturedChange;
use uuid::Uuid;

use crate::TestApp;
use crate::git_repo::git;

/// The change from `base` to what is staged in `dir` (after `git add -A`),
/// as the worker's capture records it: a binary, full-index patch and
/// its files.
pub fn staged_change(dir: &Path, base: &str, scope: ChangeScope) -> CapturedChange {
    git(dir, &["add", "-A"]);
    let patch = git_bytes(dir, &["diff", "--cached", "--binary", "--full-index", "-M", base]);
    let files = changed_files(dir, base);
    let totals = ChangeTotals {
        files: files.len() as u64,
        additions: files.iter().map(|f| f.additions).sum(),
        deletions: files.iter().map(|f| f.deletions).sum(),
    };
    CapturedChange {
        scope,
        base_commit: Some(base.to_owned()),
        tree: None,
        files,
        totals,
        patch_bytes: patch.len() as u64,
        patch: Some(patch),
        too_large: false,
    }
}

fn git_bytes(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("git").args(args).current_dir(dir).output().expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// `git diff --cached --numstat` and `--name-status` of the same change
/// (`-z`: paths as they are, unquoted), joined per file.
fn changed_files(dir: &Path, base: &str) -> Vec<FileChange> {
    let numstat = git_bytes(dir, &["diff", "--cached", "--numstat", "-z", "-M", base]);
    let statuses = git_bytes(dir, &["diff", "--cached", "--name-status", "-z", "-M", base]);
    let mut counts = Vec::new();
    let mut tokens = numstat.split(|b| *b == 0).map(|t| String::from_utf8_lossy(t).into_owned());
    while let Some(token) = tokens.next().filter(|t| !t.is_empty()) {
        let mut parts = token.splitn(3, '\t');
        let (added, deleted, path) = (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned(), parts.next());
        if path == Some("") {
            // A rename: the two paths follow.
            tokens.next();
            tokens.next();
        }
        counts.push((added, deleted));
    }
    let mut files = Vec::new();
    let mut tokens = statuses.split(|b| *b == 0).map(|t| String::from_utf8_lossy(t).into_owned());
    while let Some(status) = tokens.next().filter(|t| !t.is_empty()) {
        let first = tokens.next().unwrap();
        let (path, old_path) = match &status[..1] {
            "R" | "C" => (tokens.next().unwrap(), Some(first)),
            _ => (first, None),
        };
        let (added, deleted) = &counts[files.len()];
        files.push(FileChange {
            path,
            old_path,
            status: match &status[..1] {
                "A" => FileStatus::Added,
                "D" => FileStatus::Deleted,
                "R" => FileStatus::Renamed,
                "C" => FileStatus::Copied,
                "T" => FileStatus::TypeChanged,
                _ => FileStatus::Modified,
            },
            additions: added.parse().unwrap_or(0),
            deletions: deleted.parse().unwrap_or(0),
            binary: added == "-",
        });
    }
    files
}

impl TestApp {
    /// A run of `sub` against the repository at `url`, taken by a stand-in
    /// worker (the app runs none) that saves `changes` with the store's
    /// functions under the run's lease, announces them with
    /// `changes.captured` and ends the run: the path the worker takes.
    pub async fn run_with_change(&self, sub: &str, url: &str, changes: &[CapturedChange]) -> Uuid {
        let spec = CreateRun {
            repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
            ..CreateRun::new("change the repository")
        };
        let run = self.submit(sub, spec).await;
        let (claimed, lease) =
            self.store.claim_run("stand-in", Duration::from_secs(120)).await.unwrap().expect("the run to claim");
        assert_eq!(claimed.id, run.id);
        for change in changes {
            self.store.save_run_changes(&lease, change).await.expect("save the change");
        }
        if let Some(own) = changes.iter().find(|c| c.scope == ChangeScope::Run) {
            let t = own.totals;
            let captured = EventBody::ChangesCaptured {
                files: t.files,
                additions: t.additions,
                deletions: t.deletions,
                too_large: own.too_large,
            };
            self.store.append_event(&lease, &captured).await.unwrap();
        }
        let done = EventBody::RunSucceeded { summary: "changed it".into() };
        self.store.finish_run(&lease, &done, None).await.unwrap();
        run.id
    }
}
