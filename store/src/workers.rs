//! Worker presence and session activity: what the sandbox reaper needs to
//! decide which containers nobody will use again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Store, StoreError};

/// Whether a session may still need its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionActivity {
    /// A run of the session is queued, running or awaiting approval.
    pub active: bool,
    /// When its last run ended; `None` if none has.
    pub last_finished_at: Option<DateTime<Utc>>,
}

/// What this database knows of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerPresence {
    /// Seen within the given window.
    Alive,
    /// Known, but not seen within the window, or its lock was found free
    /// (`presence`): its process is gone.
    Gone,
    /// Never registered here (another deployment sharing the Docker engine).
    Unknown,
}

impl Store {
    /// Records that `worker` is alive now, driving the Docker engine
    /// `engine` (its `info` ID) when known.
    pub async fn worker_seen(&self, worker: &str, engine: Option<&str>) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO workers (id, engine) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET seen_at = now(), engine = coalesce($2, workers.engine)",
                &[&worker, &engine],
            )
            .await?;
        Ok(())
    }

    /// How many workers other than `worker` were seen within `window`
    /// driving `engine`.
    pub async fn other_live_workers_on_engine(
        &self,
        worker: &str,
        engine: &str,
        window: Duration,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM workers
                 WHERE engine = $2 AND id <> $1 AND seen_at > now() - $3 * interval '1 millisecond'",
                &[&worker, &engine, &(window.as_secs_f64() * 1000.0)],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Removes a worker's row on a clean exit.
    pub async fn worker_gone(&self, worker: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("DELETE FROM workers WHERE id = $1", &[&worker]).await?;
        Ok(())
    }

    /// Whether `worker` was seen within `window` and has not been found
    /// without its lock since.
    pub async fn worker_presence(&self, worker: &str, window: Duration) -> Result<WorkerPresence, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT seen_at > now() - $2 * interval '1 millisecond' AND lost_at IS NULL
                 FROM workers WHERE id = $1",
                &[&worker, &(window.as_secs_f64() * 1000.0)],
            )
            .await?;
        Ok(match row {
            None => WorkerPresence::Unknown,
            Some(r) if r.get::<_, bool>(0) => WorkerPresence::Alive,
            Some(_) => WorkerPresence::Gone,
        })
    }

    /// `None` when this database has no such session.
    pub async fn session_activity(&self, session_id: Uuid) -> Result<Option<SessionActivity>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*),
                        bool_or(status IN ('queued','running','awaiting_approval')),
                        max(finished_at)
                 FROM runs WHERE session_id = $1",
                &[&session_id],
            )
            .await?;
        if row.get::<_, i64>(0) == 0 {
            return Ok(None);
        }
        Ok(Some(SessionActivity {
            active: row.get::<_, Option<bool>>(1).unwrap_or(false),
            last_finished_at: row.get(2),
        }))
    }
}
