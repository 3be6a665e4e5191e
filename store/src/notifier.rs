//! NOTIFY outside the write it announces.
//!
//! Postgres serialises the commits of transactions that NOTIFY: each holds
//! one database-wide lock from just before its commit until the end of it,
//! and with `synchronous_commit = on` that end waits for the WAL flush. So
//! the worker's hot writes (events, messages with events, a run's end) used
//! to commit one at a time however many runs were writing, each paying a
//! whole flush alone. Measured with four workers: a finish that notifies
//! cost about three claims.
//!
//! Instead these writes commit without notifying, and then hand their
//! notification to this task, which sends it (with any others waiting) in
//! one transaction of its own on its own connection with `synchronous_commit
//! = off`: that commit does not wait for the flush, so the lock is held for
//! microseconds, and the durable writes commit in groups again.
//!
//! A notification is sent after the row it announces is committed, as
//! before. One can be lost if this process dies in between, or while the
//! connection is down; listeners never depend on one alone (SSE streams and
//! idle workers also poll), so a lost one costs latency, not events.

use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio_postgres::NoTls;

/// Most notifications sent in one transaction.
const BATCH: usize = 512;

const MIN_GAP: std::time::Duration = std::time::Duration::from_millis(2);

const SEND: &str = "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)";

pub(crate) struct Notifier {
    config: tokio_postgres::Config,
    /// Started with the first notification: the store is built outside any
    /// runtime in places, and most processes that build one never notify.
    /// Started again if its runtime went away (a store used from another).
    tx: Mutex<Option<mpsc::UnboundedSender<(&'static str, String)>>>,
}

impl Notifier {
    pub(crate) fn new(mut config: tokio_postgres::Config) -> Self {
        config.options("-c synchronous_commit=off");
        config.application_name("kiln-notifier");
        Notifier { config, tx: Mutex::new(None) }
    }

    /// Queues `NOTIFY channel, payload`. Never waits.
    pub(crate) fn notify(&self, channel: &'static str, payload: String) {
        let mut tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let mut message = (channel, payload);
        if let Some(sender) = tx.as_ref() {
            match sender.send(message) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => message = back,
            }
        }
        let (new_tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_loop(self.config.clone(), rx));
        let _ = new_tx.send(message);
        *tx = Some(new_tx);
    }
}

async fn send_loop(config: tokio_postgres::Config, mut rx: mpsc::UnboundedReceiver<(&'static str, String)>) {
    let mut conn: Option<(tokio_postgres::Client, tokio_postgres::Statement)> = None;
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_sent: Option<tokio::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        if let Some(at) = last_sent {
            tokio::time::sleep_until(at + MIN_GAP).await;
        }
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let channels: Vec<&str> = batch.iter().map(|(c, _)| *c).collect();
        let payloads: Vec<&str> = batch.iter().map(|(_, p)| p.as_str()).collect();
        // One try on the connection we have, one on a new one; then the
        // batch is dropped (see the module comment).
        for _ in 0..2 {
            if conn.is_none() {
                conn = connect(&config).await;
            }
            let Some((client, send)) = &conn else { break };
            match client.execute(send, &[&channels, &payloads]).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "sending notifications failed; reconnecting");
                    conn = None;
                }
            }
        }
        batch.clear();
        last_sent = Some(tokio::time::Instant::now());
    }
}

async fn connect(config: &tokio_postgres::Config) -> Option<(tokio_postgres::Client, tokio_postgres::Statement)> {
    let (client, connection) = match config.connect(NoTls).await {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(error = %e, "the notifier cannot connect; notifications wait for the pollers");
            return None;
        }
    };
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "notifier connection ended");
        }
    });
    let send = client.prepare(SEND).await.ok()?;
    Some((client, send))
}
