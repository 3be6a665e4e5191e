//! Git repositories the tests make for runs to clone: `git` run with a fixed
//! identity (no global configuration needed), and a repository of given
//! files as a `file://` URL (the test workers allow those).

use std::path::Path;
use std::process::Command;

/// Runs `git args` in `dir` as a fixed author; its stdout, trimmed. Panics
/// with git's stderr when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A repository (branch `main`, one commit) holding `files` (`path`,
/// `content`; parent directories made), and its `file://` URL. The
/// directory goes when the returned guard drops.
pub fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, content) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("the file's directory");
        }
        std::fs::write(path, content).expect("the file");
    }
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["add", "."]);
    git(dir.path(), &["commit", "-q", "--allow-empty", "-m", "init"]);
    let url = format!("file://{}", dir.path().display());
    (dir, url)
}
