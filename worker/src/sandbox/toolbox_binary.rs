//! Finding the toolbox binary on the worker's machine and copying it into a
//! container, so any image (not only `kiln-sandbox`) gets a toolbox.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::backend::Provenance;
use super::{Sandbox, SandboxError};

/// Where the copied binary lives in the container: not under `/tmp` (a
/// tmpfs the model can fill) and on the root filesystem, which is not noexec.
pub const CONTAINER_PATH: &str = "/usr/local/libexec/kiln/kiln-toolbox";
/// The directory of [`CONTAINER_PATH`]: a small tmpfs volume of its own (see
/// `disk`), root-owned, so the binary can be copied in even where the root
/// filesystem is read-only, and the command user cannot replace it.
pub const CONTAINER_DIR: &str = "/usr/local/libexec/kiln";
/// What to run when no local binary was found: an image that ships the
/// toolbox has it on `PATH`.
pub const IMAGE_COMMAND: &str = "kiln-toolbox";
pub const BINARY_NAME: &str = "kiln-toolbox";
pub const PATH_ENV: &str = "KILN_TOOLBOX_PATH";

/// The binary's bytes, read once per process: every session copies the same
/// file, and a missing one is logged once rather than per session.
static BINARY: OnceLock<Option<Vec<u8>>> = OnceLock::new();

/// The toolbox binary to copy into containers, if one can be found.
pub fn local_binary(configured: Option<&Path>) -> Option<&'static [u8]> {
    BINARY
        .get_or_init(|| {
            let candidates = candidates(configured);
            for path in &candidates {
                match std::fs::read(path) {
                    Ok(bytes) => {
                        tracing::info!(path = %path.display(), "using the toolbox binary");
                        return Some(bytes);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot read the toolbox binary"),
                }
            }
            tracing::debug!(tried = ?candidates, "no kiln-toolbox binary found");
            None
        })
        .as_deref()
}

/// The target triple a static toolbox is built for on this machine: the gnu
/// one, named explicitly with `--target` so that `-C target-feature=+crt-static`
/// reaches the toolbox and not the host's build scripts and proc-macros
/// (which cannot be static). `None` off Linux/glibc.
pub fn static_target() -> Option<String> {
    cfg!(all(target_os = "linux", target_env = "gnu")).then(|| format!("{}-unknown-linux-gnu", std::env::consts::ARCH))
}

/// Where Cargo puts the static toolbox (built with `--target`) for the
/// profile whose output directory is `profile_dir` (`<target-dir>/debug`).
pub fn static_binary_in(profile_dir: &Path) -> Option<PathBuf> {
    let profile = profile_dir.file_name()?;
    let target_dir = profile_dir.parent()?;
    Some(target_dir.join(static_target()?).join(profile).join(BINARY_NAME))
}

/// In order: the configured path, `KILN_TOOLBOX_PATH`, then, next to the
/// running executable and one directory up (test binaries live in
/// `target/debug/deps` while Cargo puts the toolbox in `target/debug`), the
/// static build of that profile before the plain one: the static one runs
/// in any image, the plain one only where the image's glibc suits it.
fn candidates(configured: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = configured.map(Path::to_path_buf).into_iter().collect();
    if let Some(env) = std::env::var_os(PATH_ENV).filter(|v| !v.is_empty()) {
        // An explicit setting is the only candidate: falling back to another
        // binary would hide a typo.
        out.push(PathBuf::from(env));
        return out;
    }
    if !out.is_empty() {
        return out;
    }
    if let Some(dir) = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf)) {
        for dir in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
            out.extend(static_binary_in(dir));
            out.push(dir.join(BINARY_NAME));
        }
    }
    out
}

impl Sandbox {
    /// Puts `binary` at [`CONTAINER_PATH`] (root-owned, mode 0755), unless
    /// the backend made the sandbox with it already there.
    pub(super) async fn install_toolbox(&self, binary: &[u8], provenance: Provenance) -> Result<(), SandboxError> {
        Ok(self.backend.install_toolbox(&self.id, binary, &self.config, provenance).await?)
    }
}

/// Copies `binary` to [`CONTAINER_PATH`] through the backend's archive,
/// into the volume mounted at [`CONTAINER_DIR`].
pub(super) async fn copy_in(
    backend: &(impl super::backend::SandboxBackend + ?Sized),
    id: &str,
    binary: &[u8],
) -> Result<(), super::backend::BackendError> {
    let tarball = tar_with_binary(binary).map_err(super::backend::BackendError::Io)?;
    let body = futures::stream::once(std::future::ready(Ok::<_, std::io::Error>(bytes::Bytes::from(tarball))));
    backend.put_archive(id, CONTAINER_DIR, Box::pin(body)).await
}

fn tar_with_binary(binary: &[u8]) -> Result<Vec<u8>, std::io::Error> {
    let mut builder = tar::Builder::new(Vec::with_capacity(binary.len() + 4096));
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o755);
    header.set_size(binary.len() as u64);
    builder.append_data(&mut header, BINARY_NAME, binary)?;
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tarball_holds_an_executable_named_as_the_container_path_says() {
        let tarball = tar_with_binary(b"\x7fELF").unwrap();
        let mut archive = tar::Archive::new(tarball.as_slice());
        let entries: Vec<(String, u32)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.header().mode().unwrap())
            })
            .collect();
        assert_eq!(entries, [("kiln-toolbox".to_owned(), 0o755)]);
        assert_eq!(format!("{CONTAINER_DIR}/{BINARY_NAME}"), CONTAINER_PATH);
    }

    #[test]
    fn the_static_build_sits_beside_the_profile_under_its_target_triple() {
        let triple = static_target().unwrap();
        assert_eq!(
            static_binary_in(Path::new("/src/target/release")).unwrap(),
            Path::new("/src/target").join(triple).join("release/kiln-toolbox")
        );
    }
}
