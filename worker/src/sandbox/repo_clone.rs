//! Cloning a run's repository on the worker's side. The URL is the
//! tenant's, so the clone is treated like any connection a user names, and
//! its content like anything else the tenant controls:
//! - where: the host is resolved and vetted (`crate::net_guard`), and git is
//!   pinned to the vetted addresses (`http.curloptResolve`), so DNS
//!   rebinding cannot swap them; redirects are not followed; `git://` and
//!   ssh only when the deployment allows them; no credentials in the URL;
//! - how: git runs with no configuration of the worker's (no global or
//!   system config, credential helpers, URL rewrites, hooks or LFS filters);
//! - how much: the checkout is bounded (`KILN_MAX_REPO_MB`): the clone's
//!   directory is watched while git fetches, the tree's size is read from
//!   git before anything is checked out, and the upload counts again;
//! - what the tenant learns: a failed clone is "could not clone the
//!   repository"; git's own words (which would tell a port scanner what it
//!   found) go to the worker's log only.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kiln_protocol::repo_url::{RepoHost, RepoRules, RepoScheme, RepoUrlError, parse_repo_url};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::Command;

use super::SandboxError;
use crate::net_guard::{GuardError, HostRef, resolve_vetted};

/// Longest a clone may take before the run fails.
const CLONE_TIMEOUT: Duration = Duration::from_secs(300);
/// How much of git's stderr reaches the worker's log.
const MAX_STDERR: u64 = 16 * 1024;
/// How often the clone's directory is measured while git writes it.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// What one tree entry costs beyond its bytes (a tar header, roughly), so
/// that millions of empty files count too.
pub const ENTRY_OVERHEAD: u64 = 512;

/// What this worker lets a repository clone do.
#[derive(Debug, Clone, Copy)]
pub struct CloneSettings {
    pub rules: RepoRules,
    /// `file://` URLs (the worker's own disk; `KILN_ALLOW_FILE_REPOS`).
    pub allow_file: bool,
    /// Largest checkout, `.git` included (`KILN_MAX_REPO_MB`).
    pub max_bytes: u64,
}

impl CloneSettings {
    pub fn max_mb(&self) -> u64 {
        self.max_bytes / (1024 * 1024)
    }
}

/// Clones `raw_url` at `git_ref` (branch, tag or commit) into `dest`.
pub async fn clone_repo(
    raw_url: &str,
    git_ref: Option<&str>,
    dest: &Path,
    settings: &CloneSettings,
) -> Result<(), SandboxError> {
    let url = parse_repo_url(raw_url).map_err(refused)?;
    if url.scheme == RepoScheme::File && !settings.allow_file {
        return Err(SandboxError::RepoRefused(
            "file:// repositories are disabled on this worker (KILN_ALLOW_FILE_REPOS)".into(),
        ));
    }
    settings.rules.check(&url).map_err(refused)?;
    let mut config = isolated_config(settings.allow_file);
    if let Some(host) = &url.host {
        let host_ref = match host {
            RepoHost::Ip(ip) => HostRef::Ip(*ip),
            RepoHost::Name(name) => HostRef::Name(name),
        };
        let addrs = resolve_vetted(host_ref, url.port, settings.rules.allow_private).await.map_err(|e| match e {
            GuardError::NotPublic { kind, .. } => refused(RepoUrlError::NotPublic(kind)),
            GuardError::Resolve { .. } => clone_failed("resolving the repository's host", &e.to_string()),
        })?;
        // Pinned: curl connects to these and does not look the name up again.
        // (git:// and ssh are vetted but not pinned; they are off by default.)
        if let (RepoHost::Name(name), RepoScheme::Https | RepoScheme::Http) = (host, url.scheme) {
            let list: Vec<String> = addrs
                .iter()
                .map(|a| match a.ip() {
                    std::net::IpAddr::V4(ip) => ip.to_string(),
                    std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                })
                .collect();
            config.push(("http.curloptResolve".into(), format!("{name}:{}:{}", url.port, list.join(","))));
        }
    }
    let git = Git { config, protocols: protocols(settings) };
    let dest_str = dest.to_str().ok_or_else(|| SandboxError::Workspace("temp path is not UTF-8".into()))?;
    // A commit cannot be named to `clone --branch`; fetch history instead.
    let commit = git_ref.filter(|r| looks_like_commit(r));
    // Nothing is checked out before the tree's size is known.
    let mut args: Vec<&str> = vec!["clone", "--quiet", "--no-tags", "--no-checkout"];
    if commit.is_none() {
        args.extend(["--depth", "1"]);
        if let Some(r) = git_ref {
            args.extend(["--branch", r]);
        }
    }
    args.extend(["--", &url.normalized, dest_str]);
    git.run(&args, None, Some((dest, settings))).await?;
    git.checkout_within(dest, commit, settings).await
}

/// Checks out `HEAD` (or `commit`, detached) of a clone made with
/// `--no-checkout`, if the tree fits in what is left of the cap; the
/// GitHub checkout, which clones with its token, ends with this too.
pub async fn checkout_within(dest: &Path, commit: Option<&str>, settings: &CloneSettings) -> Result<(), SandboxError> {
    let git = Git { config: isolated_config(settings.allow_file), protocols: protocols(settings) };
    git.checkout_within(dest, commit, settings).await
}

fn refused(e: RepoUrlError) -> SandboxError {
    SandboxError::RepoRefused(e.to_string())
}

fn too_large(settings: &CloneSettings) -> SandboxError {
    SandboxError::RepoTooLarge { limit_mb: settings.max_mb() }
}

/// The tenant gets the generic error; the worker's log gets git's words.
fn clone_failed(what: &str, detail: &str) -> SandboxError {
    tracing::warn!(detail = %detail.trim(), "{what} failed");
    SandboxError::CloneFailed
}

fn protocols(settings: &CloneSettings) -> String {
    let mut p = String::from("https:http");
    if settings.rules.allow_git_protocols {
        p.push_str(":git:ssh");
    }
    if settings.allow_file {
        p.push_str(":file");
    }
    p
}

/// Configuration git runs with instead of the worker's own.
fn isolated_config(allow_file: bool) -> Vec<(String, String)> {
    [
        // Hooks of a repository the tenant wrote must not run here.
        ("core.hooksPath", "/dev/null"),
        // An empty value clears every credential helper configured so far.
        ("credential.helper", ""),
        ("http.followRedirects", "false"),
        // LFS would fetch from wherever `.lfsconfig` says.
        ("filter.lfs.smudge", ""),
        ("filter.lfs.process", ""),
        ("filter.lfs.required", "false"),
        ("protocol.file.allow", if allow_file { "always" } else { "never" }),
        // Submodules are not cloned (no --recurse-submodules); nor may a
        // later git command in this directory fetch them.
        ("submodule.recurse", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn looks_like_commit(r: &str) -> bool {
    (7..=40).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_hexdigit())
}

struct Git {
    config: Vec<(String, String)>,
    protocols: String,
}

impl Git {
    async fn checkout_within(
        &self,
        dest: &Path,
        commit: Option<&str>,
        settings: &CloneSettings,
    ) -> Result<(), SandboxError> {
        let rev = commit.unwrap_or("HEAD");
        let fetched = dir_size(dest.to_owned()).await?;
        if fetched > settings.max_bytes || self.tree_size(dest, rev, settings.max_bytes - fetched).await?.is_none() {
            return Err(too_large(settings));
        }
        let checkout: Vec<&str> = match commit {
            Some(c) => vec!["checkout", "--quiet", "--force", "--detach", c],
            None => vec!["checkout", "--quiet", "--force", "HEAD"],
        };
        self.run(&checkout, Some(dest), Some((dest, settings))).await
    }

    fn command(&self, args: &[&str], cwd: Option<&Path>) -> Command {
        let mut cmd = Command::new("git");
        cmd.args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ALLOW_PROTOCOL", &self.protocols)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_LFS_SKIP_SMUDGE", "1")
            .env_remove("GIT_ASKPASS")
            .env_remove("SSH_ASKPASS")
            .env("GIT_CONFIG_COUNT", self.config.len().to_string())
            .stdin(Stdio::null())
            // Its own process group: git's helpers (remote-https, index-pack)
            // are stopped with it.
            .process_group(0)
            .kill_on_drop(true);
        for (i, (k, v)) in self.config.iter().enumerate() {
            cmd.env(format!("GIT_CONFIG_KEY_{i}"), k).env(format!("GIT_CONFIG_VALUE_{i}"), v);
        }
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        cmd
    }

    /// Runs git; with `watch`, stops it once the directory outgrows the cap.
    async fn run(
        &self,
        args: &[&str],
        cwd: Option<&Path>,
        watch: Option<(&Path, &CloneSettings)>,
    ) -> Result<(), SandboxError> {
        let verb = args.first().copied().unwrap_or("git");
        let mut cmd = self.command(args, cwd);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| clone_failed(&format!("starting git {verb}"), &e.to_string()))?;
        let pid = child.id();
        let stderr = child.stderr.take();
        // What the server makes git print is kept to a bound, the rest read
        // and dropped (git must not block on a full pipe).
        let said = async move {
            let mut kept = Vec::new();
            if let Some(mut stderr) = stderr {
                let _ = (&mut stderr).take(MAX_STDERR).read_to_end(&mut kept).await;
                let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
            }
            kept
        };
        let finished = async { tokio::join!(child.wait(), said) };
        let outgrown = async {
            match watch {
                Some((dir, settings)) => until_larger_than(dir, settings.max_bytes).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            out = tokio::time::timeout(CLONE_TIMEOUT, finished) => match out {
                Err(_) => {
                    kill_group(pid);
                    Err(clone_failed(&format!("git {verb}"), "timed out"))
                }
                Ok((Err(e), _)) => Err(clone_failed(&format!("git {verb}"), &e.to_string())),
                Ok((Ok(status), said)) if !status.success() => {
                    Err(clone_failed(&format!("git {verb}"), &String::from_utf8_lossy(&said)))
                }
                Ok(_) => Ok(()),
            },
            () = outgrown => {
                kill_group(pid);
                let settings = watch.map(|(_, s)| s);
                Err(settings.map_or(SandboxError::CloneFailed, too_large))
            }
        }
    }

    /// Bytes the tree of `rev` holds (plus [`ENTRY_OVERHEAD`] per entry),
    /// read from git's object store without writing a file; `None` once it
    /// exceeds `max` (git is stopped there).
    async fn tree_size(&self, dir: &Path, rev: &str, max: u64) -> Result<Option<u64>, SandboxError> {
        let mut cmd = self.command(&["ls-tree", "-r", "-l", "-z", "--", rev], Some(dir));
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| clone_failed("starting git ls-tree", &e.to_string()))?;
        let stdout = child.stdout.take().ok_or_else(|| clone_failed("git ls-tree", "no stdout"))?;
        let mut lines = tokio::io::BufReader::new(stdout).split(0);
        let mut total: u64 = 0;
        // `<mode> <type> <object> <size>\t<path>`; the size is `-` for
        // submodule entries (nothing to check out).
        while let Some(entry) = lines.next_segment().await? {
            let meta = entry.split(|b| *b == b'\t').next().unwrap_or_default();
            let size = std::str::from_utf8(meta)
                .ok()
                .and_then(|m| m.split_ascii_whitespace().nth(3))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
            total = total.saturating_add(size).saturating_add(ENTRY_OVERHEAD);
            if total > max {
                kill_group(child.id());
                return Ok(None);
            }
        }
        let status = child.wait().await?;
        if !status.success() {
            return Err(clone_failed("git ls-tree", &format!("exited with {status}")));
        }
        Ok(Some(total))
    }
}

/// Kills git and every helper it started (they share its process group).
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Returns once `dir` holds more than `max` bytes.
async fn until_larger_than(dir: &Path, max: u64) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if dir_size(dir.to_owned()).await.is_ok_and(|size| size > max) {
            return;
        }
    }
}

/// Bytes under `dir` (files' lengths plus [`ENTRY_OVERHEAD`] per entry),
/// symlinks not followed; 0 for a directory not made yet.
pub async fn dir_size(dir: std::path::PathBuf) -> Result<u64, SandboxError> {
    tokio::task::spawn_blocking(move || {
        let mut total: u64 = 0;
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for entry in entries.flatten() {
                let Ok(meta) = entry.path().symlink_metadata() else { continue };
                total = total.saturating_add(meta.len()).saturating_add(ENTRY_OVERHEAD);
                if meta.is_dir() {
                    stack.push(entry.path());
                }
            }
        }
        total
    })
    .await
    .map_err(|e| SandboxError::Workspace(format!("measuring the checkout failed: {e}")))
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

    fn settings(allow_private: bool) -> CloneSettings {
        CloneSettings {
            rules: RepoRules { allow_private, allow_git_protocols: false },
            allow_file: false,
            max_bytes: 1 << 20,
        }
    }

    #[tokio::test]
    async fn credentials_and_internal_hosts_are_refused_before_git_runs() {
        let dest = tempfile::tempdir().unwrap();
        for (url, expected) in [
            ("https://user:tok3n@example.com/r.git", "credentials"),
            ("http://localhost:9/r.git", "KILN_ALLOW_PRIVATE_REPOS"),
            ("http://10.255.255.1:9/r.git", "KILN_ALLOW_PRIVATE_REPOS"),
            ("git://example.com/r.git", "KILN_ALLOW_GIT_PROTOCOLS"),
            ("file:///etc", "KILN_ALLOW_FILE_REPOS"),
        ] {
            let err = clone_repo(url, None, &dest.path().join("r"), &settings(false)).await.unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, SandboxError::RepoRefused(_)), "{url}: {text}");
            assert!(text.contains(expected), "{url}: {text}");
            assert!(!text.contains("tok3n") && !text.contains("10.255"), "{text}");
        }
        assert!(!dest.path().join("r").exists());
    }
}
