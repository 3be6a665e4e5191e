//! What a test process logs, kept in memory for checks (each test is its
//! own process under nextest, so one subscriber per test).

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing_subscriber::filter::LevelFilter;

/// Every byte written to it; clones share the buffer.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Installs a plain-text subscriber for `level` and above writing here.
    /// Panics if the process already has one.
    pub fn capture(level: LevelFilter) -> Logs {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("no other subscriber in this test process");
        logs
    }

    /// Installs a plain-text subscriber filtered as `kiln` filters its own
    /// logs ([`kiln_cli::telemetry::log_filter`]) with `default` for
    /// `RUST_LOG`. Panics if the process already has one.
    pub fn capture_as_kiln(default: &str) -> Logs {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_env_filter(kiln_cli::telemetry::log_filter(default))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("no other subscriber in this test process");
        logs
    }

    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
