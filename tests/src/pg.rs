//! A Postgres server of the test's own, on a free loopback port, that the
//! test may stop and start (database-fault tests cannot restart the shared
//! server under other tests' feet).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
    as_root: bool,
}

impl PrivatePostgres {
    /// initdb + start. Runs the server as `postgres` when the test is root
    /// (Postgres refuses root).
    pub fn start() -> PrivatePostgres {
        let bin = newest_bin().expect("a Postgres server under /usr/lib/postgresql (.ci/run installs one)");
        let as_root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
        let dir = tempfile::Builder::new().prefix("kiln-pg-").tempdir_in("/var/tmp").unwrap();
        if as_root {
            assert!(Command::new("chown").arg("postgres:postgres").arg(dir.path()).status().unwrap().success());
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = PrivatePostgres { dir, port, bin, as_root };
        let status = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["--username=kiln", "--auth=trust", "--encoding=UTF8", "--no-instructions"])
            .output()
            .unwrap();
        assert!(status.status.success(), "initdb: {}", String::from_utf8_lossy(&status.stderr));
        pg.start_server();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    pub fn admin_url(&self) -> String {
        format!("postgres://kiln@127.0.0.1:{}/postgres", self.port)
    }

    pub fn start_server(&self) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "30", "-o"])
            .arg(format!("-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories=''", self.port))
            .arg("start")
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the server at once, dropping every connection.
    pub fn stop_server(&self) {
        let out =
            self.command("pg_ctl").arg("-D").arg(self.data()).args(["-m", "fast", "-w", "stop"]).output().unwrap();
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the server, waits `down`, and starts it again.
    pub fn restart(&self, down: Duration) {
        self.stop_server();
        std::thread::sleep(down);
        self.start_server();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.command("pg_ctl").arg("-D").arg(self.data()).args(["-m", "immediate", "stop"]).output();
    }
}

fn newest_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| Path::new(bin).join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}
