//! A real bare repository for the fake GitHub to serve.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `owner/name.git` under a temporary directory (the fake's git root), with
/// `main` (README.md) and `feature` (also feature.txt).
pub struct BareRepo {
    dir: tempfile::TempDir,
    bare: PathBuf,
}

impl BareRepo {
    /// Creates `full_name` (`owner/name`).
    pub fn create(full_name: &str) -> BareRepo {
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join(format!("{full_name}.git"));
        let work = dir.path().join("work");
        std::fs::create_dir_all(&bare).unwrap();
        git(dir.path(), &["init", "--quiet", "--bare", "-b", "main", bare.to_str().unwrap()]);
        // http-backend refuses pushes from unauthenticated users unless told;
        // the fake checks the token itself.
        git(&bare, &["config", "http.receivepack", "true"]);
        git(dir.path(), &["init", "--quiet", "-b", "main", work.to_str().unwrap()]);
        std::fs::write(work.join("README.md"), "# widget\n").unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "--quiet", "-m", "initial"]);
        git(&work, &["checkout", "--quiet", "-b", "feature"]);
        std::fs::write(work.join("feature.txt"), "only on the feature branch\n").unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "--quiet", "-m", "feature"]);
        git(&work, &["push", "--quiet", bare.to_str().unwrap(), "main", "feature"]);
        std::fs::remove_dir_all(&work).unwrap();
        BareRepo { dir, bare }
    }

    /// The directory holding `owner/name.git` (`GIT_PROJECT_ROOT`).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The bare repository itself.
    pub fn path(&self) -> &Path {
        &self.bare
    }

    /// `git <args>` in the bare repository; stdout.
    pub fn git(&self, args: &[&str]) -> String {
        git(&self.bare, args)
    }
}

/// `git <args>` in `cwd` as a test user; panics on failure; stdout.
pub fn git(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
