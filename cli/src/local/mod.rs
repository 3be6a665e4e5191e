//! What `kiln up` sets up on one machine: a project-local Postgres cluster,
//! the sandbox image, a JWT secret, and the demo repository.

pub mod cluster;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use secrecy::SecretString;
use tokio::process::Command;

pub use cluster::{DEFAULT_LOCAL_PG_PORT, LocalCluster};

/// Runs a command, failing with its stderr when it fails.
pub(crate) async fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.stdin(Stdio::null()).output().await.with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads a secret file, creating it (mode 0600, random hex) if missing.
/// The file under the state directory that holds `kiln up`'s JWT secret.
pub const JWT_SECRET_FILE: &str = "jwt-secret";

pub fn read_or_create_secret(path: &Path) -> anyhow::Result<String> {
    if let Ok(s) = std::fs::read_to_string(path) {
        let s = s.trim().to_owned();
        if !s.is_empty() {
            return Ok(s);
        }
    }
    let bytes: [u8; 32] = rand::random();
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, &secret).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(secret)
}

/// The signing secret `kiln up` keeps in `state_dir`, for `kiln token`
/// without `KILN_JWT_SECRET`; its absence says where a secret comes from.
pub fn read_local_secret(state_dir: &Path) -> anyhow::Result<SecretString> {
    let path = state_dir.join(JWT_SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => Ok(SecretString::from(s.trim().to_owned())),
        Ok(_) => bail!("{} is empty: run `kiln up` to make a new one, or set KILN_JWT_SECRET", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no signing secret: set KILN_JWT_SECRET (or --jwt-secret) to the API's secret; \
             under `kiln up` it is in {} (run kiln token from the directory you ran kiln up in, \
             or set KILN_STATE_DIR)",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// FNV-1a: a stable name for a directory, not a security measure.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100000001b3))
}

/// Builds the sandbox image with the offline script when it is missing.
pub async fn ensure_sandbox_image(image: &str) -> anyhow::Result<()> {
    let docker = bollard::Docker::connect_with_local_defaults().context("connecting to Docker")?;
    if docker.inspect_image(image).await.is_ok() {
        return Ok(());
    }
    let script = std::env::var_os("KILN_SANDBOX_BUILD_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../sandbox-images/build-offline.sh"));
    if !script.exists() {
        bail!("sandbox image {image} is missing and {} was not found to build it", script.display());
    }
    eprintln!("kiln: building the sandbox image {image} (first run only, a few minutes)…");
    let status = Command::new("bash").arg(&script).arg(image).status().await?;
    if !status.success() {
        bail!("building the sandbox image failed ({status}); see the output above");
    }
    Ok(())
}

/// A small git repository for the demo run, created once.
pub async fn ensure_demo_repo(state_dir: &Path) -> anyhow::Result<PathBuf> {
    let repo = std::fs::canonicalize(state_dir)?.join("demo-repo");
    if repo.join(".git").exists() {
        return Ok(repo);
    }
    std::fs::create_dir_all(&repo)?;
    std::fs::write(
        repo.join("README.md"),
        "# demo\n\nA tiny repository Kiln's demo run works on.\n\nRun `python3 hello.py`.\n",
    )?;
    std::fs::write(
        repo.join("hello.py"),
        "def greet(name):\n    return f\"hello, {name}\"\n\nprint(greet(\"kiln\"))\n",
    )?;
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.args(["-c", "user.name=Kiln", "-c", "user.email=kiln@localhost", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(&repo);
        c
    };
    run(&mut git(&["init", "-q"]), "git init").await?;
    run(&mut git(&["add", "."]), "git add").await?;
    run(&mut git(&["commit", "-q", "-m", "demo repository"]), "git commit").await?;
    Ok(repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_created_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let a = read_or_create_secret(&p).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(read_or_create_secret(&p).unwrap(), a);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
