//! A worker's presence: a session-level advisory lock held on a connection
//! of its own (outside the pool) for as long as the worker lives, and what
//! the other workers read from it.
//!
//! Postgres lets go of a session's advisory locks the moment its connection
//! closes, so a worker that dies (SIGKILL, OOM, a lost host whose kernel
//! resets the connection) frees its lock within milliseconds. Every live
//! worker looks about once a second for registered workers whose lock is
//! free ([`Store::hand_back_dead_workers`]) and returns their runs to the
//! queue at once, counting the loss, instead of waiting for their leases.
//! The lease still fences every write; the lock only makes takeover fast.
//!
//! The key is a number from the `worker_lock_keys` sequence, taken per
//! process, not a hash of the worker's id: two workers alive at once never
//! share one, and two deployments in one database share the sequence (and
//! the `workers` table), so they cannot collide either. The two-integer form
//! of the lock (class [`LOCK_CLASS`]) lives apart from the single-bigint
//! locks Kiln and most applications take.
//!
//! A lock only counts in the server lifetime it was taken in (`lock_epoch`
//! = `pg_postmaster_start_time()`): after a restart or a failover every lock
//! is free, and that says nothing about the workers until each takes its
//! key again.

use std::time::Duration;

use tokio_postgres::{Client, NoTls, Statement};

use crate::lease::{HEARTBEAT, HeartbeatOutcome, Lease, ReapedRun, millis};
use crate::{Store, StoreError, channels};

/// The first key of every worker lock: "KILN" in ASCII.
pub const LOCK_CLASS: i32 = 0x4b49_4c4e;

/// A worker's own connection, holding its lock. Dropping it closes the
/// connection, which lets go of the lock.
pub struct PresenceSession {
    client: Client,
    key: i32,
    heartbeat: Statement,
    /// Drives the connection; aborted on drop.
    connection: tokio::task::JoinHandle<()>,
    /// Turns `true` when the connection has ended, for whatever reason.
    ended: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for PresenceSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PresenceSession").field("key", &self.key).finish()
    }
}

/// What taking the lock found.
#[derive(Debug)]
pub struct Registered {
    pub session: PresenceSession,
    /// The worker's earlier session in this process held this same key and
    /// nobody found it free since: the runs it held are still its own.
    /// `false` at a process's start, or when other workers found the lock
    /// free meanwhile and handed its runs back.
    pub kept: bool,
}

/// Another worker's lock was found free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadWorkers {
    pub workers: Vec<String>,
    /// Their runs, back in the queue (or failed, out of attempts).
    pub runs: Vec<ReapedRun>,
}

impl PresenceSession {
    /// The key this session holds.
    pub fn key(&self) -> i32 {
        self.key
    }

    /// Waits until the connection has ended: from then on the lock is not
    /// held (or will not be, once the server notices).
    pub async fn closed(&self) {
        let mut ended = self.ended.clone();
        // An error means the connection task is gone: ended too.
        let _ = ended.wait_for(|ended| *ended).await;
    }

    /// Extends a run's lease over this connection, as [`Store::heartbeat`]
    /// does over the pool: a worker that lost its lock can extend nothing.
    pub async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<HeartbeatOutcome, StoreError> {
        let row = self
            .client
            .query_opt(&self.heartbeat, &[&lease.run_id, &lease.attempt, &lease.worker, &millis(extend)])
            .await?;
        match row {
            Some(r) => Ok(HeartbeatOutcome { cancel_requested: r.try_get(0)? }),
            None => Err(StoreError::LeaseLost(lease.run_id)),
        }
    }
}

impl Drop for PresenceSession {
    fn drop(&mut self) {
        // The connection task would end with the client anyway; aborting it
        // closes the socket now, so the lock goes at once.
        self.connection.abort();
    }
}

impl Store {
    /// Connects on a connection of `worker`'s own, takes its lock (`key`
    /// again after a reconnect, a new one from the sequence at start) and
    /// records it in `workers`. Runs held under `worker`'s name that are not
    /// its own any more (an earlier process of the same name, or runs it
    /// lost while the lock was free) go back to the queue, not counted as
    /// lost. `Ok(None)`: the key is still held, by this worker's earlier
    /// connection the server has not yet seen close; try again later.
    pub async fn register_worker(&self, worker: &str, key: Option<i32>) -> Result<Option<Registered>, StoreError> {
        let mut config = tokio_postgres::Config::clone(&self.presence_config);
        config.application_name("kiln-worker-lock");
        let (mut client, connection) =
            config.connect(NoTls).await.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let (ended_tx, ended) = tokio::sync::watch::channel(false);
        let connection = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "the worker's lock connection failed");
            }
            let _ = ended_tx.send(true);
        });
        let key = match key {
            Some(key) => key,
            None => client.query_one("SELECT nextval('worker_lock_keys')::int4", &[]).await?.try_get(0)?,
        };
        // Locked before it is published: no other worker can see the key
        // while it is free and take this worker for dead.
        let locked: bool =
            client.query_one("SELECT pg_try_advisory_lock($1, $2)", &[&LOCK_CLASS, &key]).await?.try_get(0)?;
        if !locked {
            return Ok(None);
        }
        let tx = client.transaction().await?;
        let row = tx
            .query_one(
                "WITH before AS (
                     SELECT lock_key = $2 AND lost_at IS NULL AS kept FROM workers WHERE id = $1 FOR UPDATE
                 ), reg AS (
                     INSERT INTO workers (id, lock_key, lock_epoch)
                     VALUES ($1, $2, pg_postmaster_start_time())
                     ON CONFLICT (id) DO UPDATE SET lock_key = $2, lock_epoch = pg_postmaster_start_time(),
                                                     lost_at = NULL, seen_at = now()
                 )
                 SELECT COALESCE((SELECT kept FROM before), false)",
                &[&worker, &key],
            )
            .await?;
        let kept: bool = row.try_get(0)?;
        if !kept {
            tx.execute(
                "WITH rel AS (
                     UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL
                     WHERE lease_owner = $1 AND status IN ('running', 'awaiting_approval')
                     RETURNING id
                 )
                 SELECT pg_notify($2, id::text) FROM rel",
                &[&worker, &channels::RUNS_QUEUED],
            )
            .await?;
        }
        tx.commit().await?;
        let heartbeat = client.prepare(HEARTBEAT).await?;
        Ok(Some(Registered { session: PresenceSession { client, key, heartbeat, connection, ended }, kept }))
    }

    /// Finds the registered workers whose lock is free in this server's
    /// lifetime, marks them lost and returns their runs to the queue,
    /// counting the loss as the lease reaper does. Workers that check at the
    /// same time each take different dead workers (the rows are locked and
    /// skipped), so a loss is counted once.
    pub async fn hand_back_dead_workers(&self) -> Result<DeadWorkers, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // A dead worker's run row may be locked for a while: by a worker
        // whose lock connection failed mid-transaction and that stands
        // still until it is back or its lease is over. Rather than stall
        // this worker's claim loop behind it, give up and look again at the
        // next check (the lease remains the fallback).
        tx.batch_execute("SET LOCAL lock_timeout = '2s'").await?;
        // `pg_try_advisory_xact_lock` probes each registered key without
        // waiting: a live worker's session holds it (false); a dead one's is
        // free, and stays taken by this transaction until it commits, so the
        // verdict cannot change under it. It touches only the registered
        // keys, where reading `pg_locks` would lock the whole lock table.
        let rows = tx
            .query(
                "WITH candidates AS MATERIALIZED (
                     SELECT id, lock_key FROM workers
                     WHERE lock_key IS NOT NULL AND lost_at IS NULL AND lock_epoch = pg_postmaster_start_time()
                     FOR UPDATE SKIP LOCKED
                 ), dead AS MATERIALIZED (
                     SELECT id FROM candidates WHERE pg_try_advisory_xact_lock($1, lock_key)
                 )
                 UPDATE workers w SET lost_at = now() FROM dead WHERE w.id = dead.id RETURNING w.id",
                &[&LOCK_CLASS],
            )
            .await?;
        let workers = rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<String>, _>>()?;
        if workers.is_empty() {
            tx.commit().await?;
            return Ok(DeadWorkers { workers, runs: Vec::new() });
        }
        // Not SKIP LOCKED: a run row locked for a moment (a cancel request)
        // must not be left behind, as its worker is marked lost now and will
        // not be looked at again.
        let runs = crate::queue::lose_runs(
            &tx,
            "SELECT id FROM runs WHERE lease_owner = ANY($1) AND status IN ('running', 'awaiting_approval')
             FOR UPDATE",
            &[&workers],
        )
        .await?;
        tx.commit().await?;
        drop(client);
        if runs.iter().any(|r| r.status == kiln_protocol::RunStatus::Failed)
            && let Err(e) = self.sweep_owed_follow_ups().await
        {
            tracing::warn!(error = %e, "looking for owed follow-ups failed; the next sweep will");
        }
        Ok(DeadWorkers { workers, runs })
    }
}
