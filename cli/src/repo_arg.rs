//! `kiln run --repo`: a repository URL as the API takes it, or a directory
//! on this machine, which becomes a `file://` URL (for a Kiln on the same
//! machine, such as `kiln up`, where local repositories are allowed).

use std::path::Path;

/// The URL to send for `given`.
pub fn repo_url(given: &str) -> anyhow::Result<String> {
    if looks_like_url(given) {
        return Ok(given.to_owned());
    }
    let path = Path::new(given);
    if !path.is_dir() {
        anyhow::bail!(
            "--repo {given:?} is neither a repository URL (https://…, ssh://…, git@host:path, file:///…) \
             nor a directory on this machine"
        );
    }
    let absolute = std::fs::canonicalize(path)?;
    let url = url::Url::from_directory_path(&absolute)
        .map_err(|()| anyhow::anyhow!("--repo {given:?}: {} cannot be written as a file:// URL", absolute.display()))?;
    // Without the trailing slash git shows the same name a clone would.
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// A scheme (`https://`) or git's scp-like form (`git@host:owner/repo`).
fn looks_like_url(given: &str) -> bool {
    if given.contains("://") {
        return true;
    }
    match given.split_once(':') {
        Some((user_host, _)) => user_host.contains('@') && !user_host.contains('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pass_through_and_directories_become_file_urls() {
        assert_eq!(repo_url("https://github.com/o/r.git").unwrap(), "https://github.com/o/r.git");
        assert_eq!(repo_url("git@github.com:o/r.git").unwrap(), "git@github.com:o/r.git");
        let dir = tempfile::tempdir().unwrap();
        let url = repo_url(dir.path().to_str().unwrap()).unwrap();
        let canonical = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(url, format!("file://{}", canonical.display()));
    }

    #[test]
    fn a_path_that_is_not_there_says_what_was_expected() {
        let e = repo_url("no/such/dir").unwrap_err().to_string();
        assert!(e.contains("neither a repository URL") && e.contains("no/such/dir"), "{e}");
    }
}
