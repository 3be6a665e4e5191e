//! Small file operations (`stat`, `ls`, `write`) and what every file tool
//! shares: resolving paths, versions, and turning I/O errors into errors the
//! model can act on.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::protocol::{
    ErrorKind, FileKind, FileVersion, LsEntry, LsRequest, LsResult, StatRequest, StatResult, ToolError, WriteRequest,
    WriteResult,
};

/// A request path: relative paths are taken from `base` (where the toolbox
/// started, i.e. the workspace).
pub fn resolve(base: &Path, path: &str) -> Result<PathBuf, ToolError> {
    if path.is_empty() {
        return Err(ToolError::new(ErrorKind::InvalidArgument, "path must not be empty"));
    }
    // `components` drops `.` segments ("/workspace/." → "/workspace"); `..`
    // is kept, since resolving it lexically would be wrong across symlinks.
    Ok(base.join(path).components().collect())
}

pub fn version_of(meta: &Metadata) -> FileVersion {
    FileVersion { size: meta.len(), mtime_ns: mtime_ns(meta) }
}

pub fn mtime_ns(meta: &Metadata) -> i64 {
    meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec())
}

pub fn kind_of(ft: fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// An I/O error on `path`, phrased for the model.
pub fn io_error(path: &Path, e: &io::Error) -> ToolError {
    let p = path.display();
    let (kind, message) = match e.kind() {
        io::ErrorKind::NotFound => (ErrorKind::NotFound, format!("{p}: no such file or directory")),
        io::ErrorKind::PermissionDenied => (ErrorKind::PermissionDenied, format!("{p}: permission denied")),
        io::ErrorKind::IsADirectory => (ErrorKind::IsDirectory, format!("{p} is a directory")),
        io::ErrorKind::NotADirectory => {
            (ErrorKind::NotADirectory, format!("{p}: a component of the path is not a directory"))
        }
        _ => (ErrorKind::Io, format!("{p}: {e}")),
    };
    ToolError::new(kind, message)
}

/// Metadata (following symlinks) of a path that must be a regular file.
pub fn regular_file(path: &Path) -> Result<Metadata, ToolError> {
    let meta = fs::metadata(path).map_err(|e| io_error(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::new(
            ErrorKind::IsDirectory,
            format!("{} is a directory; use ls to list it", path.display()),
        ));
    }
    if !meta.is_file() {
        // Opening a FIFO would block forever; devices have no meaningful size.
        return Err(ToolError::new(
            ErrorKind::InvalidArgument,
            format!("{} is not a regular file (a device, socket or FIFO)", path.display()),
        ));
    }
    Ok(meta)
}

/// Refuses with `conflict` when the file is not at the version the caller
/// last saw (the worker's view-before-edit rule).
pub fn check_expected(
    path: &Path,
    current: Option<FileVersion>,
    expected: Option<FileVersion>,
) -> Result<(), ToolError> {
    match (expected, current) {
        (None, _) => Ok(()),
        (Some(e), Some(c)) if e == c => Ok(()),
        (Some(_), Some(_)) => Err(ToolError::new(
            ErrorKind::Conflict,
            format!("{} has changed since it was last read; view it again before changing it", path.display()),
        )),
        (Some(_), None) => Err(ToolError::new(
            ErrorKind::Conflict,
            format!("{} no longer exists; it was removed since it was last read", path.display()),
        )),
    }
}

pub fn stat(base: &Path, req: &StatRequest) -> Result<StatResult, ToolError> {
    let path = resolve(base, &req.path)?;
    let meta = fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
    Ok(StatResult {
        path: path.to_string_lossy().into_owned(),
        kind: kind_of(meta.file_type()),
        size: meta.len(),
        mtime_ns: mtime_ns(&meta),
    })
}

pub fn ls(base: &Path, req: &LsRequest) -> Result<LsResult, ToolError> {
    let path = resolve(base, &req.path)?;
    let meta = fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
    if !meta.is_dir() {
        return Err(ToolError::new(
            ErrorKind::NotADirectory,
            format!("{} is not a directory; use view to read it", path.display()),
        ));
    }
    let mut entries = Vec::new();
    for entry in fs::read_dir(&path).map_err(|e| io_error(&path, &e))? {
        let Ok(entry) = entry else { continue };
        let (kind, size) = match entry.metadata() {
            Ok(m) => (kind_of(m.file_type()), m.len()),
            Err(_) => (FileKind::Other, 0),
        };
        entries.push(LsEntry { name: entry.file_name().to_string_lossy().into_owned(), kind, size });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let keep = usize::try_from(req.max_entries).unwrap_or(usize::MAX);
    let omitted = entries.len().saturating_sub(keep) as u64;
    entries.truncate(keep);
    Ok(LsResult { path: path.to_string_lossy().into_owned(), entries, omitted })
}

/// Writes the whole file in place (keeping its inode, mode and any symlink
/// pointing at it), creating missing parent directories.
pub fn write(base: &Path, req: &WriteRequest) -> Result<WriteResult, ToolError> {
    let path = resolve(base, &req.path)?;
    let current = match fs::metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(ToolError::new(ErrorKind::IsDirectory, format!("{} is a directory", path.display())));
        }
        Ok(m) => Some(version_of(&m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(&path, &e)),
    };
    check_expected(&path, current, req.expected)?;
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
    }
    let version = write_bytes(&path, req.content.as_bytes())?;
    Ok(WriteResult {
        path: path.to_string_lossy().into_owned(),
        bytes_written: req.content.len() as u64,
        created: current.is_none(),
        version,
    })
}

/// Writes `bytes` to `path` and returns the version it now has.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<FileVersion, ToolError> {
    fs::write(path, bytes).map_err(|e| io_error(path, &e))?;
    let meta = fs::metadata(path).map_err(|e| io_error(path, &e))?;
    Ok(version_of(&meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_creates_parents_and_honours_the_expected_version() {
        let dir = tempfile::tempdir().unwrap();
        let req = WriteRequest { path: "a/b/c.txt".into(), content: "one\n".into(), expected: None };
        let first = write(dir.path(), &req).unwrap();
        assert!(first.created);
        assert_eq!(fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(), "one\n");

        let stale = FileVersion { size: 1, mtime_ns: 1 };
        let err = write(dir.path(), &WriteRequest { content: "two\n".into(), expected: Some(stale), ..req.clone() })
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Conflict);
        let ok = write(dir.path(), &WriteRequest { expected: Some(first.version), ..req }).unwrap();
        assert!(!ok.created);
    }

    #[test]
    fn ls_sorts_caps_and_types_entries() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("b.txt"), "xx").unwrap();
        fs::write(dir.path().join("a.txt"), "x").unwrap();
        let r = ls(dir.path(), &LsRequest { path: ".".into(), max_entries: 2 }).unwrap();
        assert_eq!(
            r.entries,
            vec![
                LsEntry { name: "a.txt".into(), kind: FileKind::File, size: 1 },
                LsEntry { name: "b.txt".into(), kind: FileKind::File, size: 2 },
            ]
        );
        assert_eq!(r.omitted, 1);
        let err = ls(dir.path(), &LsRequest { path: "a.txt".into(), max_entries: 2 }).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotADirectory);
        let err = ls(dir.path(), &LsRequest { path: "nope".into(), max_entries: 2 }).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
    }
}
