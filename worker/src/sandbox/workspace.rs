//! Getting a checkout into the sandbox: the worker clones it on its own
//! side (`repo_clone`; credentials stay here), then streams it into
//! `/workspace` through the backend's archive (Docker's archive API). The tar is written on a
//! blocking thread into a bounded channel the upload reads from, so the
//! worker holds a few chunks of it at a time, never the tree; and the walk
//! counts bytes, failing past the cap (`KILN_MAX_REPO_MB`).

use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::files::parse_user;
use super::repo_clone::ENTRY_OVERHEAD;
use super::{Sandbox, SandboxError, WORKSPACE};

/// Size of one chunk of the tar stream, and how many may wait in the channel.
const CHUNK: usize = 256 * 1024;
const CHUNKS_IN_FLIGHT: usize = 4;

impl Sandbox {
    /// Streams the contents of `dir` into `/workspace`, owned by the sandbox
    /// user. Fails with [`SandboxError::RepoTooLarge`] once the tree passes
    /// `max_bytes` (the upload is then cut short; the caller discards the
    /// half-filled sandbox).
    pub async fn upload_dir(&self, dir: &Path, max_bytes: u64) -> Result<(), SandboxError> {
        let (uid, gid) = parse_user(&self.config.user);
        let dir = dir.to_owned();
        let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
        let writer = tokio::task::spawn_blocking(move || {
            let mut sink = ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
            let result = tar_dir(&dir, uid, gid, max_bytes, &mut sink).and_then(|()| Ok(sink.flush()?));
            if let Err(e) = &result {
                // Ends the body with an error: Docker sees a broken upload,
                // not a short tar it would accept.
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
            result
        });
        let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let uploaded = self.backend.put_archive(&self.id, WORKSPACE, Box::pin(body)).await;
        let written = writer.await.map_err(|e| SandboxError::Workspace(format!("tar task failed: {e}")))?;
        match (written, uploaded) {
            // Too large says more than the broken upload it caused.
            (Err(e @ SandboxError::RepoTooLarge { .. }), _) => Err(e),
            // Docker's refusal says more than the tar's "stopped reading".
            (_, Err(e)) => Err(e.into()),
            (Err(e), Ok(())) => Err(e),
            (Ok(()), Ok(())) => Ok(()),
        }
    }
}

/// Hands what the tar builder writes to the upload, a chunk at a time,
/// waiting while the channel is full.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| std::io::Error::other("the upload stopped reading"))
    }
}

/// Tars `root` into `out` with every entry owned by `uid:gid`, symlinks
/// kept as links; stops once the entries pass `max_bytes`.
fn tar_dir(root: &Path, uid: u64, gid: u64, max_bytes: u64, out: &mut impl Write) -> Result<(), SandboxError> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut total: u64 = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let rel = path.strip_prefix(root).map_err(|e| SandboxError::Workspace(e.to_string()))?;
            let meta = std::fs::symlink_metadata(&path)?;
            total = total.saturating_add(meta.len()).saturating_add(ENTRY_OVERHEAD);
            if total > max_bytes {
                return Err(SandboxError::RepoTooLarge { limit_mb: max_bytes / (1024 * 1024) });
            }
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
    builder.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_of_a_tree_has_every_entry_owned_by_the_user() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("b.txt"), "b").unwrap();
        let mut t = Vec::new();
        tar_dir(dir.path(), 1000, 1000, 1 << 20, &mut t).unwrap();
        let mut names = Vec::new();
        for e in tar::Archive::new(t.as_slice()).entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(e.header().uid().unwrap(), 1000);
            names.push(e.path().unwrap().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(names, ["b.txt", "sub", "sub/a.txt"]);
    }

    #[test]
    fn a_tree_past_the_cap_stops_the_tar() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![0u8; 100_000]).unwrap();
        let mut t = Vec::new();
        let err = tar_dir(dir.path(), 1000, 1000, 50_000, &mut t).unwrap_err();
        assert!(matches!(err, SandboxError::RepoTooLarge { .. }), "{err}");
        assert!(t.len() < 50_000);
    }
}
