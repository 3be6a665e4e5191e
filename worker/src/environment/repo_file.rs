//! `.kiln/environment.toml`: the environment a repository keeps for runs
//! that name none, read from the run's base commit in the worker's own
//! checkout.
//!
//! Read through git, not the file system: a symbolic link in the
//! repository (to a file of the worker's) is refused rather than followed,
//! and the size is known before a byte is read.

use std::path::Path;

use kiln_protocol::EnvironmentSpec;
use kiln_protocol::environment::{EnvironmentFile, EnvironmentFileError, MAX_REPOSITORY_FILE_BYTES, REPOSITORY_FILE};

/// What the name check of the file's environment sees; events and
/// messages call it by the file's path.
const NAME: &str = "repository";

/// The environment the checkout at `dir` defines at `HEAD`; `Ok(None)`:
/// it has no such file; `Err`: why the run fails.
pub async fn read(dir: &Path) -> Result<Option<EnvironmentSpec>, String> {
    let listed = super::git(dir, &["ls-tree", "-l", "-z", "HEAD", "--", REPOSITORY_FILE])
        .await
        .ok_or_else(|| format!("reading {REPOSITORY_FILE}: git did not run"))?;
    if !listed.status.success() {
        // No commit to read from (an empty repository): no file either.
        return Ok(None);
    }
    let line = String::from_utf8_lossy(&listed.stdout);
    let Some(entry) = Entry::parse(line.trim_end_matches('\0')) else { return Ok(None) };
    if entry.mode == "120000" || entry.kind != "blob" {
        return Err(EnvironmentFileError::NotAFile.to_string());
    }
    if entry.size > MAX_REPOSITORY_FILE_BYTES {
        return Err(EnvironmentFileError::TooLarge(entry.size).to_string());
    }
    let blob = super::git(dir, &["cat-file", "blob", entry.object])
        .await
        .filter(|o| o.status.success())
        .ok_or_else(|| format!("reading {REPOSITORY_FILE} from the commit failed"))?;
    let text = String::from_utf8(blob.stdout)
        .map_err(|_| EnvironmentFileError::Parse("it is not UTF-8 text".into()).to_string())?;
    EnvironmentFile::parse(&text, NAME).map(Some).map_err(|e| e.to_string())
}

/// One entry of `git ls-tree -l`: `<mode> <type> <object> <size>\t<path>`.
struct Entry<'a> {
    mode: &'a str,
    kind: &'a str,
    object: &'a str,
    size: u64,
}

impl<'a> Entry<'a> {
    fn parse(line: &'a str) -> Option<Entry<'a>> {
        let (meta, _path) = line.split_once('\t')?;
        let mut fields = meta.split_whitespace();
        let (mode, kind, object) = (fields.next()?, fields.next()?, fields.next()?);
        // A submodule's size is `-`: not a file to read.
        let size = fields.next()?.parse().unwrap_or(u64::MAX);
        Some(Entry { mode, kind, object, size })
    }
}
