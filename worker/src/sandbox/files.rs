//! Reading and writing single files through the Docker archive API, so
//! content crosses byte for byte with no shell quoting involved.

use bytes::Bytes;
use futures::StreamExt;
use std::io::Read;

use bollard::query_parameters::{DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder};

use super::{Sandbox, SandboxError, WORKSPACE};

/// A file problem the model can act on.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("no such file: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDirectory(String),
    #[error("{path} is {size} bytes; files over {limit} bytes cannot be read whole yet")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("invalid path {0:?}")]
    InvalidPath(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Resolves a model-supplied path: relative paths are under `/workspace`.
pub fn resolve(path: &str) -> Result<String, FileError> {
    if path.is_empty() || path.contains('\0') {
        return Err(FileError::InvalidPath(path.to_owned()));
    }
    Ok(if path.starts_with('/') { path.to_owned() } else { format!("{WORKSPACE}/{path}") })
}

impl Sandbox {
    /// Reads a whole file, up to `limit` bytes.
    pub async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>, FileError> {
        let abs = resolve(path)?;
        let options = DownloadFromContainerOptionsBuilder::new().path(&abs).build();
        let mut stream = self.docker.download_from_container(&self.id, Some(options));
        let mut tarball = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    tarball.extend_from_slice(&bytes);
                    // The tar adds headers; allow for them before giving up.
                    if tarball.len() as u64 > limit + 64 * 1024 {
                        return Err(FileError::TooLarge { path: path.to_owned(), size: tarball.len() as u64, limit });
                    }
                }
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                    return Err(FileError::NotFound(path.to_owned()));
                }
                Err(e) => return Err(SandboxError::from(e).into()),
            }
        }
        let mut archive = tar::Archive::new(tarball.as_slice());
        let mut entries = archive.entries().map_err(SandboxError::from)?;
        let Some(entry) = entries.next() else {
            return Err(FileError::NotFound(path.to_owned()));
        };
        let mut entry = entry.map_err(SandboxError::from)?;
        if entry.header().entry_type().is_dir() {
            return Err(FileError::IsDirectory(path.to_owned()));
        }
        let size = entry.header().size().map_err(SandboxError::from)?;
        if size > limit {
            return Err(FileError::TooLarge { path: path.to_owned(), size, limit });
        }
        let mut content = Vec::with_capacity(size as usize);
        entry.read_to_end(&mut content).map_err(SandboxError::from)?;
        Ok(content)
    }

    /// Writes a file (creating parent directories), owned by the sandbox user.
    pub async fn write_file(&self, path: &str, content: &[u8]) -> Result<(), FileError> {
        let abs = resolve(path)?;
        let (parent, name) = abs.rsplit_once('/').ok_or_else(|| FileError::InvalidPath(path.to_owned()))?;
        if name.is_empty() || name == "." || name == ".." {
            return Err(FileError::InvalidPath(path.to_owned()));
        }
        let parent = if parent.is_empty() { "/" } else { parent };
        self.ensure_dir(parent).await?;
        let tarball = single_file_tar(name, content, &self.config.user).map_err(SandboxError::from)?;
        let options = UploadToContainerOptionsBuilder::new().path(parent).build();
        self.docker
            .upload_to_container(&self.id, Some(options), bollard::body_full(Bytes::from(tarball)))
            .await
            .map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                    FileError::NotFound(parent.to_owned())
                }
                other => SandboxError::from(other).into(),
            })
    }

    async fn ensure_dir(&self, dir: &str) -> Result<(), FileError> {
        let quoted = format!("'{}'", dir.replace('\'', "'\\''"));
        let out = self.exec(&format!("mkdir -p -- {quoted}"), std::time::Duration::from_secs(10), 4096, |_| {}).await?;
        if out.exit_code != Some(0) {
            return Err(FileError::InvalidPath(format!("{dir}: {}", out.output.trim())));
        }
        Ok(())
    }
}

/// A tar holding one regular file owned by `user` (`uid:gid`).
fn single_file_tar(name: &str, content: &[u8], user: &str) -> std::io::Result<Vec<u8>> {
    let (uid, gid) = parse_user(user);
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    header.set_entry_type(tar::EntryType::Regular);
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_data(&mut header, name, content)?;
    builder.into_inner()
}

pub(crate) fn parse_user(user: &str) -> (u64, u64) {
    let mut it = user.split(':');
    let uid = it.next().and_then(|u| u.parse().ok()).unwrap_or(1000);
    let gid = it.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
    (uid, gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_land_in_the_workspace() {
        assert_eq!(resolve("a/b.txt").unwrap(), "/workspace/a/b.txt");
        assert_eq!(resolve("/etc/hosts").unwrap(), "/etc/hosts");
        assert!(resolve("").is_err());
        assert!(resolve("a\0b").is_err());
    }

    #[test]
    fn tar_entry_has_owner_and_content() {
        let t = single_file_tar("x.txt", b"hi", "1000:1001").unwrap();
        let mut a = tar::Archive::new(t.as_slice());
        let mut e = a.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(e.header().uid().unwrap(), 1000);
        assert_eq!(e.header().gid().unwrap(), 1001);
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hi");
    }
}
