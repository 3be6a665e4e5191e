//! What `kiln up` sets up on one machine: a project-local Postgres cluster,
//! the sandbox image, a JWT secret, and the demo repository.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use secrecy::SecretString;
use tokio::process::Command;

/// Port of the local cluster; off the default so a system Postgres can coexist.
pub const DEFAULT_LOCAL_PG_PORT: u16 = 54329;

/// Runs a command, failing with its stderr when it fails.
async fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.stdin(Stdio::null()).output().await.with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn is_root() -> bool {
    run(Command::new("id").arg("-u"), "id -u").await.map(|s| s.trim() == "0").unwrap_or(false)
}

/// The newest installed Postgres server's bin directory.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

/// Starts (creating it the first time) a Postgres cluster for this project
/// and returns its URL. As root the server runs as the `postgres` user
/// (Postgres refuses root) with its data under /var/lib/kiln.
pub async fn ensure_local_postgres(state_dir: &Path, port: u16) -> anyhow::Result<String> {
    let root = is_root().await;
    let bin = match postgres_bin_dir() {
        Some(bin) => bin,
        None if root => {
            eprintln!("kiln: installing PostgreSQL from the Debian packages (apt-get)…");
            run(Command::new("apt-get").arg("update").arg("-q"), "apt-get update").await?;
            run(
                Command::new("apt-get")
                    .args(["install", "-y", "-q", "postgresql"])
                    .env("DEBIAN_FRONTEND", "noninteractive"),
                "apt-get install postgresql",
            )
            .await?;
            postgres_bin_dir().context("postgresql was installed but pg_ctl was not found")?
        }
        None => bail!("PostgreSQL is not installed: run `sudo apt-get install postgresql`, or set DATABASE_URL"),
    };
    let state_dir = std::fs::canonicalize(state_dir)?;
    let base = if root {
        // Postgres cannot run as root, and the postgres user may not be able
        // to enter the project directory (e.g. under /root).
        PathBuf::from(format!("/var/lib/kiln/pg-{:016x}", fnv1a(state_dir.to_string_lossy().as_bytes())))
    } else {
        state_dir.join("pg")
    };
    let data = base.join("data");
    let log = base.join("postgres.log");
    std::fs::create_dir_all(&base)?;
    let password = read_or_create_secret(&state_dir.join("pg-password"))?;
    let as_pg = |program: &Path| -> Command {
        if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    };
    if root {
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&base), "chown").await?;
    }
    if !data.join("PG_VERSION").exists() {
        eprintln!("kiln: creating a local Postgres cluster in {}", data.display());
        let pwfile = base.join("pwfile");
        std::fs::write(&pwfile, &password)?;
        if root {
            run(Command::new("chown").arg("postgres:postgres").arg(&pwfile), "chown").await?;
        }
        std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o600))?;
        let result = run(
            as_pg(&bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["--username=kiln", "--auth=scram-sha-256", "--encoding=UTF8", "--no-instructions"])
                .arg(format!("--pwfile={}", pwfile.display())),
            "initdb",
        )
        .await;
        let _ = std::fs::remove_file(&pwfile);
        result?;
    }
    let running = as_pg(&bin.join("pg_ctl")).arg("-D").arg(&data).arg("status").stdout(Stdio::null()).status().await?;
    if !running.success() {
        eprintln!("kiln: starting local Postgres on 127.0.0.1:{port} (log: {})", log.display());
        run(
            as_pg(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories=''"))
                .arg("start"),
            "pg_ctl start",
        )
        .await?;
    }
    Ok(format!("postgres://kiln:{password}@127.0.0.1:{port}/postgres"))
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
fn fnv1a(bytes: &[u8]) -> u64 {
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
