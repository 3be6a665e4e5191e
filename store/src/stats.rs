//! Counts for the `/metrics` gauges: runs by status and the queue's depth
//! and age, in one statement.

use crate::{Store, StoreError};

/// Runs by status across the deployment (all workers, all API instances).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    /// `(status, count)` for every status that has runs.
    pub by_status: Vec<(String, i64)>,
    /// Runs waiting to be claimed.
    pub queued: i64,
    /// Seconds since the oldest queued run was submitted; 0 when none waits.
    pub oldest_queued_age_s: f64,
}

impl Store {
    /// One pass over `runs` grouped by status. Its cost grows with the
    /// table, so the API caches the answer between scrapes (see
    /// `ApiSettings::metrics_refresh`).
    pub async fn run_stats(&self) -> Result<RunStats, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT status, count(*),
                        COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
                 FROM runs GROUP BY status",
                &[],
            )
            .await?;
        let mut stats = RunStats::default();
        for row in rows {
            let status: String = row.get(0);
            let count: i64 = row.get(1);
            if status == "queued" {
                stats.queued = count;
                stats.oldest_queued_age_s = row.get::<_, f64>(2).max(0.0);
            }
            stats.by_status.push((status, count));
        }
        Ok(stats)
    }
}
