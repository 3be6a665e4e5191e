//! Getting a repository into the sandbox: the worker clones it on its own
//! side (credentials stay here), then uploads the tree through the Docker
//! archive API.

use std::path::Path;
use std::time::Duration;

use bollard::query_parameters::UploadToContainerOptionsBuilder;
use bytes::Bytes;
use tokio::process::Command;

use super::files::parse_user;
use super::{Sandbox, SandboxError, WORKSPACE};

/// Longest a clone may take before the run fails.
const CLONE_TIMEOUT: Duration = Duration::from_secs(300);

/// Clones `url` at `git_ref` (branch, tag or commit) into `dest`.
/// `allow_file` permits `file://` URLs, which read the worker's own disk and
/// are therefore off unless configured (local demos, tests).
pub async fn clone_repo(url: &str, git_ref: Option<&str>, dest: &Path, allow_file: bool) -> Result<(), SandboxError> {
    let protocols = if allow_file { "https:http:ssh:git:file" } else { "https:http:ssh:git" };
    // A commit cannot be named to `clone --branch`; fetch history instead.
    let shallow = !git_ref.is_some_and(looks_like_commit);
    let mut args: Vec<&str> = vec!["clone", "--quiet", "--no-tags"];
    if shallow {
        args.extend(["--depth", "1"]);
        if let Some(r) = git_ref {
            args.extend(["--branch", r]);
        }
    }
    let dest_str = dest.to_str().ok_or_else(|| SandboxError::Workspace("temp path is not UTF-8".into()))?;
    args.extend(["--", url, dest_str]);
    git(&args, None, protocols).await?;
    if let (false, Some(commit)) = (shallow, git_ref) {
        git(&["checkout", "--quiet", "--detach", commit], Some(dest), protocols).await?;
    }
    Ok(())
}

fn looks_like_commit(r: &str) -> bool {
    (7..=40).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn git(args: &[&str], cwd: Option<&Path>, protocols: &str) -> Result<(), SandboxError> {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", protocols)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let out = tokio::time::timeout(CLONE_TIMEOUT, cmd.output())
        .await
        .map_err(|_| SandboxError::Workspace(format!("git {} timed out", args[0])))??;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(SandboxError::Workspace(format!("git {} failed: {}", args[0], stderr.trim())));
    }
    Ok(())
}

impl Sandbox {
    /// Uploads the contents of `dir` into `/workspace`, owned by the sandbox user.
    pub async fn upload_dir(&self, dir: &Path) -> Result<(), SandboxError> {
        let (uid, gid) = parse_user(&self.config.user);
        let dir = dir.to_owned();
        let tarball = tokio::task::spawn_blocking(move || tar_dir(&dir, uid, gid))
            .await
            .map_err(|e| SandboxError::Workspace(format!("tar task failed: {e}")))??;
        let options = UploadToContainerOptionsBuilder::new().path(WORKSPACE).build();
        self.docker.upload_to_container(&self.id, Some(options), bollard::body_full(Bytes::from(tarball))).await?;
        Ok(())
    }
}

/// Tars `root` with every entry owned by `uid:gid`, symlinks kept as links.
fn tar_dir(root: &Path, uid: u64, gid: u64) -> Result<Vec<u8>, SandboxError> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let rel = path.strip_prefix(root).map_err(|e| SandboxError::Workspace(e.to_string()))?;
            let meta = std::fs::symlink_metadata(&path)?;
            let mut header = tar::Header::new_gnu();
            // Complete keeps modes and mtimes; owners are replaced below.
            header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
            header.set_uid(uid);
            header.set_gid(gid);
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path)?;
                builder.append_link(&mut header, rel, target)?;
            } else if meta.is_dir() {
                builder.append_data(&mut header, rel, std::io::empty())?;
                stack.push(path);
            } else if meta.is_file() {
                let file = std::fs::File::open(&path)?;
                builder.append_data(&mut header, rel, file)?;
            }
        }
    }
    Ok(builder.into_inner()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_ids_are_told_from_branch_names() {
        assert!(looks_like_commit("a1b2c3d"));
        assert!(looks_like_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!looks_like_commit("main"));
        assert!(!looks_like_commit("abc"));
    }

    #[test]
    fn tar_of_a_tree_has_every_entry_owned_by_the_user() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("b.txt"), "b").unwrap();
        let t = tar_dir(dir.path(), 1000, 1000).unwrap();
        let mut names = Vec::new();
        for e in tar::Archive::new(t.as_slice()).entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(e.header().uid().unwrap(), 1000);
            names.push(e.path().unwrap().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(names, ["b.txt", "sub", "sub/a.txt"]);
    }
}
