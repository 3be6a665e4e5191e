//! The Postgres cluster `kiln up` runs for a state directory when no
//! `DATABASE_URL` is set: created once, started by `kiln up`, stopped when
//! the `kiln up` that started it exits, and stopped or deleted by
//! `kiln down [--reset]`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::process::Command;

use super::{fnv1a, read_or_create_secret, run};

/// Port of the local cluster; off the default so a system Postgres can coexist.
pub const DEFAULT_LOCAL_PG_PORT: u16 = 54329;
/// The cluster's password, in the state directory.
const PASSWORD_FILE: &str = "pg-password";

/// Where a state directory's cluster lives and how to run its tools.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    /// As root the server runs as the `postgres` user (Postgres refuses
    /// root), with its files under /var/lib/kiln: that user may not be able
    /// to enter the project directory (e.g. under /root).
    root: bool,
    /// Holds `data/`, `postgres.log` and a copy of the password.
    pub base: PathBuf,
    state_dir: PathBuf,
}

impl LocalCluster {
    /// The cluster of `state_dir` (which must exist), whether or not it was
    /// ever created.
    pub async fn of(state_dir: &Path) -> anyhow::Result<LocalCluster> {
        let state_dir = std::fs::canonicalize(state_dir)
            .with_context(|| format!("the state directory {} is not there", state_dir.display()))?;
        let root = is_root().await;
        let base = if root {
            PathBuf::from(format!("/var/lib/kiln/pg-{:016x}", fnv1a(state_dir.to_string_lossy().as_bytes())))
        } else {
            state_dir.join("pg")
        };
        Ok(LocalCluster { root, base, state_dir })
    }

    pub fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    fn log(&self) -> PathBuf {
        self.base.join("postgres.log")
    }

    pub fn exists(&self) -> bool {
        self.data().join("PG_VERSION").exists()
    }

    /// Starts the cluster (creating it the first time, installing Postgres
    /// as root when it is missing) and returns its URL and whether this call
    /// started it (`false`: it was already running).
    pub async fn start(&self, port: u16) -> anyhow::Result<(String, bool)> {
        let bin = match postgres_bin_dir() {
            Some(bin) => bin,
            None if self.root => install_postgres().await?,
            None => bail!("PostgreSQL is not installed: run `sudo apt-get install postgresql`, or set DATABASE_URL"),
        };
        std::fs::create_dir_all(&self.base)?;
        let password = self.password()?;
        if self.root {
            run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&self.base), "chown").await?;
        }
        if !self.exists() {
            self.create(&bin, &password).await?;
        }
        if self.is_running(&bin).await? {
            eprintln!("kiln: using the local Postgres already running on 127.0.0.1:{port} ({})", self.data().display());
            return Ok((url(&password, port), false));
        }
        eprintln!(
            "kiln: starting local Postgres on 127.0.0.1:{port}; data in {}, log {}",
            self.data().display(),
            self.log().display()
        );
        run(
            self.as_pg(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.log())
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories=''"))
                .arg("start"),
            "pg_ctl start",
        )
        .await?;
        Ok((url(&password, port), true))
    }

    /// Stops the server if it runs; `true` if it was running.
    pub async fn stop(&self) -> anyhow::Result<bool> {
        let Some(bin) = postgres_bin_dir() else { return Ok(false) };
        if !self.exists() || !self.is_running(&bin).await? {
            return Ok(false);
        }
        run(
            self.as_pg(&bin.join("pg_ctl")).arg("-D").arg(self.data()).args(["-m", "fast", "-w", "stop"]),
            "pg_ctl stop",
        )
        .await?;
        Ok(true)
    }

    /// Stops the server and deletes its files and password.
    pub async fn delete(&self) -> anyhow::Result<()> {
        self.stop().await?;
        match std::fs::remove_dir_all(&self.base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", self.base.display())),
        }
        match std::fs::remove_file(self.state_dir.join(PASSWORD_FILE)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The cluster's password. A copy is kept beside the cluster, so that
    /// deleting the state directory (to start afresh) does not leave a
    /// cluster nobody can log in to: the copy wins when both exist.
    fn password(&self) -> anyhow::Result<String> {
        let in_state = self.state_dir.join(PASSWORD_FILE);
        let beside = self.base.join(PASSWORD_FILE);
        if self.exists()
            && let Ok(kept) = std::fs::read_to_string(&beside)
            && !kept.trim().is_empty()
        {
            let kept = kept.trim().to_owned();
            std::fs::write(&in_state, &kept)?;
            std::fs::set_permissions(&in_state, std::fs::Permissions::from_mode(0o600))?;
            return Ok(kept);
        }
        let password = read_or_create_secret(&in_state)?;
        std::fs::write(&beside, &password)?;
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o600))?;
        Ok(password)
    }

    async fn create(&self, bin: &Path, password: &str) -> anyhow::Result<()> {
        eprintln!("kiln: creating a local Postgres cluster in {}", self.data().display());
        let pwfile = self.base.join("pwfile");
        std::fs::write(&pwfile, password)?;
        if self.root {
            run(Command::new("chown").arg("postgres:postgres").arg(&pwfile), "chown").await?;
        }
        std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o600))?;
        let result = run(
            self.as_pg(&bin.join("initdb"))
                .arg("-D")
                .arg(self.data())
                .args(["--username=kiln", "--auth=scram-sha-256", "--encoding=UTF8", "--no-instructions"])
                .arg(format!("--pwfile={}", pwfile.display())),
            "initdb",
        )
        .await;
        let _ = std::fs::remove_file(&pwfile);
        result.map(|_| ())
    }

    async fn is_running(&self, bin: &Path) -> anyhow::Result<bool> {
        let status = self
            .as_pg(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("status")
            .stdout(Stdio::null())
            .status()
            .await?;
        Ok(status.success())
    }

    fn as_pg(&self, program: &Path) -> Command {
        if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

fn url(password: &str, port: u16) -> String {
    format!("postgres://kiln:{password}@127.0.0.1:{port}/postgres")
}

async fn is_root() -> bool {
    run(Command::new("id").arg("-u"), "id -u").await.map(|s| s.trim() == "0").unwrap_or(false)
}

async fn install_postgres() -> anyhow::Result<PathBuf> {
    eprintln!("kiln: installing PostgreSQL from the Debian packages (apt-get)…");
    run(Command::new("apt-get").arg("update").arg("-q"), "apt-get update").await?;
    run(
        Command::new("apt-get").args(["install", "-y", "-q", "postgresql"]).env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install postgresql",
    )
    .await?;
    postgres_bin_dir().context("postgresql was installed but pg_ctl was not found")
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
