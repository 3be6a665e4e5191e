//! Building the sandbox toolbox from Kiln's own source tree, for `kiln up`
//! run from a clone (`cargo run -- up`): `cargo run` builds only the `kiln`
//! binary, so without this a newcomer's first run would have no toolbox and
//! every tool call would be one `docker exec`.
//!
//! The toolbox is built static (`-C target-feature=+crt-static`), so it runs
//! in any image, with or without a glibc. The flag goes through `RUSTFLAGS`
//! with an explicit `--target`: Cargo then applies it to the toolbox and its
//! dependencies only, not to build scripts and proc-macros (which are built
//! for the host and cannot be static). Without `--target` it would reach
//! them and the build would fail; a workspace-wide `.cargo/config.toml`
//! would make every binary static, tests included. The result lands in
//! `<target-dir>/<triple>/<profile>/kiln-toolbox`, where the worker looks
//! first.

use std::path::{Path, PathBuf};

use kiln_worker::sandbox::{static_toolbox_in, static_toolbox_target};
use tokio::process::Command;

/// The flag that makes the toolbox static.
pub const STATIC_RUSTFLAGS: &str = "-C target-feature=+crt-static";

/// Where this executable was built, when it was built from a Kiln source
/// tree that is still there.
#[derive(Debug, Clone)]
pub struct SourceTree {
    /// The workspace root (holds `Cargo.toml` and `toolbox/`).
    pub workspace: PathBuf,
    /// Cargo's target directory.
    pub target_dir: PathBuf,
    /// The profile's output directory name (`debug`, `release`, …).
    pub profile_dir: String,
}

impl SourceTree {
    /// The tree this executable came from: its directory is a profile
    /// directory of a Cargo target directory (`CACHEDIR.TAG` marks those),
    /// and the workspace it was compiled from still has the toolbox's
    /// sources. `None` for an installed `kiln`.
    pub fn of_current_exe() -> Option<SourceTree> {
        let exe = std::env::current_exe().ok()?;
        let mut dir = exe.parent()?;
        // Test binaries live one level down, in `deps`.
        if dir.file_name().is_some_and(|n| n == "deps") {
            dir = dir.parent()?;
        }
        let target_dir = dir.parent()?;
        if !target_dir.join("CACHEDIR.TAG").is_file() {
            return None;
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
        if !workspace.join("toolbox/Cargo.toml").is_file() {
            return None;
        }
        Some(SourceTree {
            workspace: workspace.to_path_buf(),
            target_dir: target_dir.to_path_buf(),
            profile_dir: dir.file_name()?.to_string_lossy().into_owned(),
        })
    }

    /// Where the static toolbox of this profile goes.
    pub fn static_toolbox(&self) -> Option<PathBuf> {
        static_toolbox_in(&self.target_dir.join(&self.profile_dir))
    }

    /// `cargo build` of the static toolbox, in this tree's target directory
    /// and profile: up to date in a second when nothing changed, a minute or
    /// two the first time. Cargo's progress goes to our stderr.
    pub async fn build_static_toolbox(&self) -> Result<PathBuf, BuildError> {
        let triple = static_toolbox_target().ok_or(BuildError::NoStaticTarget)?;
        let out = self.static_toolbox().ok_or(BuildError::NoStaticTarget)?;
        // `cargo run` tells the program which cargo ran it.
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&self.workspace)
            .args(["build", "-p", "kiln-toolbox", "--bin", "kiln-toolbox", "--target", &triple])
            .args(profile_args(&self.profile_dir))
            .env("CARGO_TARGET_DIR", &self.target_dir)
            // Ours alone: the encoded form would win over RUSTFLAGS.
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("RUSTFLAGS", STATIC_RUSTFLAGS)
            .kill_on_drop(true);
        let status =
            cmd.status().await.map_err(|e| BuildError::Cargo(format!("{}: {e}", Path::new(&cargo).display())))?;
        if !status.success() {
            return Err(BuildError::Failed(status.to_string()));
        }
        if !out.is_file() {
            return Err(BuildError::Failed(format!("cargo succeeded but {} is not there", out.display())));
        }
        Ok(out)
    }
}

/// Cargo's arguments for the profile whose output directory is `dir`.
fn profile_args(dir: &str) -> Vec<String> {
    match dir {
        "debug" => Vec::new(),
        "release" => vec!["--release".into()],
        other => vec!["--profile".into(), other.into()],
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("a static toolbox is built only on Linux with glibc")]
    NoStaticTarget,
    #[error("cannot run cargo ({0})")]
    Cargo(String),
    #[error("cargo build of the toolbox failed ({0})")]
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::profile_args;

    #[test]
    fn the_profile_directory_names_the_profile() {
        assert!(profile_args("debug").is_empty());
        assert_eq!(profile_args("release"), ["--release"]);
        assert_eq!(profile_args("toolbox"), ["--profile", "toolbox"]);
    }
}
