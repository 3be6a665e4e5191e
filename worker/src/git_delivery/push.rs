//! Making the run's one commit and pushing it: the base fetched again from
//! the run's `repo.url` (with the same checks as any clone), the stored
//! patch applied to the index only (`git apply --cached`: nothing of the
//! patch is written to the worker's disk as files, so a symlink in it
//! cannot point a later write anywhere), one commit on the base, pushed
//! to a branch that must not exist yet.

use std::path::Path;

use super::DeliveryError;
use super::git::{Author, RemoteAccess, git};

/// Applies `patch` on `base` (`None`: the empty tree, for a run without a
/// repository) in the repository at `dir`; returns the commit made.
pub async fn commit_patch(
    dir: &Path,
    base: Option<&str>,
    patch: &[u8],
    message: &str,
    author: &Author<'_>,
) -> Result<String, DeliveryError> {
    let patch_file = dir.join(".git").join("kiln-delivery.patch");
    let message_file = dir.join(".git").join("kiln-delivery-message");
    std::fs::write(&patch_file, patch).map_err(|e| DeliveryError::Io(e.to_string()))?;
    std::fs::write(&message_file, message).map_err(|e| DeliveryError::Io(e.to_string()))?;
    let patch_path = path_str(&patch_file)?;
    match base {
        Some(commit) => git(dir, &["read-tree", commit], None, None).await?,
        None => git(dir, &["read-tree", "--empty"], None, None).await?,
    };
    git(dir, &["apply", "--cached", "--binary", "--whitespace=nowarn", patch_path], None, None)
        .await
        .map_err(|e| DeliveryError::Apply(e.to_string()))?;
    let tree = git(dir, &["write-tree"], None, None).await?;
    let mut args = vec!["commit-tree", tree.as_str(), "-F", path_str(&message_file)?];
    if let Some(commit) = base {
        args.extend(["-p", commit]);
    }
    git(dir, &args, None, Some(author)).await
}

/// Pushes `commit` to `branch` of `url`, creating it. A branch that is
/// there already is never replaced: when it holds the same change on the
/// same base (an earlier delivery of this run, whose commit id differs only
/// by its time) it is kept and reported; anything else fails. The push
/// itself carries `--force-with-lease=<ref>:` (the branch must not exist),
/// so a branch made between the check and the push fails it too.
pub async fn push_new_branch(
    dir: &Path,
    url: &str,
    branch: &str,
    commit: &str,
    access: &RemoteAccess<'_>,
) -> Result<String, DeliveryError> {
    let remote_ref = format!("refs/heads/{branch}");
    let listed = git(dir, &["ls-remote", "--", url, &remote_ref], Some(access), None).await?;
    if !listed.is_empty() {
        git(dir, &["fetch", "--quiet", "--no-tags", "--", url, &remote_ref], Some(access), None).await?;
        let theirs = git(dir, &["rev-parse", "FETCH_HEAD^{tree}", "FETCH_HEAD^@"], None, None).await?;
        let ours = git(dir, &["rev-parse", &format!("{commit}^{{tree}}"), &format!("{commit}^@")], None, None).await?;
        if theirs != ours {
            return Err(DeliveryError::BranchTaken(branch.to_owned()));
        }
        return git(dir, &["rev-parse", "FETCH_HEAD"], None, None).await;
    }
    let lease = format!("--force-with-lease={remote_ref}:");
    let refspec = format!("{commit}:{remote_ref}");
    match git(dir, &["push", "--quiet", "--no-verify", &lease, "--", url, &refspec], Some(access), None).await {
        Err(DeliveryError::Git(e)) if e.contains("stale info") || e.contains("rejected") => {
            Err(DeliveryError::BranchTaken(branch.to_owned()))
        }
        other => other.map(|_| commit.to_owned()),
    }
}

fn path_str(p: &Path) -> Result<&str, DeliveryError> {
    p.to_str().ok_or_else(|| DeliveryError::Io("temporary path is not UTF-8".into()))
}
