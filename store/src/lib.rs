//! Kiln's Postgres layer.
//!
//! [`Store`] wraps a connection pool and offers one method per query the
//! rest of Kiln needs. Worker writes are *fenced*: they carry the run's
//! [`Lease`] (run id, attempt, worker) and only land while that lease is the
//! current one, so a worker that lost its run can no longer change it.

mod admission;
mod attempts;
mod callbacks;
mod changes;
mod children;
mod control;
mod delivery;
mod end_batch;
mod environments;
mod error;
mod events;
mod follow_ups;
mod git_deliveries;
mod lease;
pub mod listen;
mod messages;
mod migrate;
mod notifier;
mod owed;
mod owner_gate;
mod presence;
mod queue;
mod queue_sql;
mod queued;
mod retention;
mod rows;
mod runs;
pub mod secrets;
mod setup_lock;
mod stats;
mod step_writes;
mod webhooks;
mod workers;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

pub use attempts::SelectOutcome;
pub use callbacks::{CallbackAttempt, CallbackJob};
pub use changes::{CapturedChange, PatchRow, PreviousRun, RunBase};
pub use children::{ChildStart, ChildSummary, NewChild};
pub use control::{Approval, DecideOutcome, Decision, InboxMessage, McpCall, MessageOutcome};
pub use delivery::{DeliveryJob, DeliveryRequest, GroupChoice};
pub use environments::{
    EnvironmentRefusal, MAX_ENVIRONMENTS_PER_OWNER, McpServersWrite, SecretsWrite, StoredEnvironment,
};
pub use error::StoreError;
pub use events::{EventBatch, EventsOpening};
pub use git_deliveries::{GitDeliveryClaim, GitDeliveryEnd};
pub use lease::{HeartbeatOutcome, Lease, ReapedRun};
pub use listen::{Listener, Notice};
pub use presence::{DeadWorkers, LOCK_CLASS, PresenceSession, Registered};
pub use queue_sql::{claim_statement, finish_and_claim_statement, finish_statement};
pub use queued::{NewRun, admission_statement};
pub use retention::Pruned;
pub use runs::{CancelOutcome, Cursor, Quota, QuotaRefusal, RunPage};
pub use setup_lock::SetupLock;
pub use stats::RunStats;
pub use step_writes::StepWrite;
pub use webhooks::{Delivery, GithubOrigin, GithubSelection, NewGithubRun, PastDelivery, Recorded};
pub use workers::{SessionActivity, WorkerPresence};

/// Channel names used with LISTEN/NOTIFY.
pub mod channels {
    /// A run was queued (payload: run id). Wakes idle workers.
    pub const RUNS_QUEUED: &str = "kiln_runs_queued";
    /// An event was stored (payload: `<run id>:<seq>`). Wakes SSE streams.
    pub const RUN_EVENTS: &str = "kiln_run_events";
    /// A client asked to cancel a run (payload: run id). Wakes its worker.
    pub const RUN_CANCEL: &str = "kiln_run_cancel";
    /// A client sent a message or an approval decision (payload: run id).
    pub const RUN_CONTROL: &str = "kiln_run_control";
    /// A run ended owing a completion callback (payload: run id; sent by the
    /// trigger in `migrations/V8__callbacks.sql`). Wakes workers.
    pub const CALLBACKS_OWED: &str = "kiln_callbacks_owed";
    /// An environment's cache was reset, or it was replaced or deleted
    /// (payload: environment id). Workers drop its warm containers.
    pub const ENVIRONMENT_CHANGED: &str = "kiln_environment_changed";
}

/// Handle to the database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Shared, as every clone's configs: a `Config` holds a dozen owned
    /// strings and lists, and the API clones its state (and so the store)
    /// for every request it answers.
    config: std::sync::Arc<tokio_postgres::Config>,
    /// Where a worker's lock connection goes (`presence`): the database's
    /// own address unless told otherwise ([`Store::with_presence_url`]).
    presence_config: std::sync::Arc<tokio_postgres::Config>,
    /// Queues an owner's groups of attempts before they take a connection.
    owner_gate: std::sync::Arc<owner_gate::OwnerGate>,
    /// An owner's single submissions, admitted together by its quota.
    admission_lines: admission::Lines,
    /// Sends the NOTIFYs of the hot writes after their commit.
    notifier: std::sync::Arc<notifier::Notifier>,
    /// Ends of this process's runs that go to the database together.
    end_batcher: std::sync::Arc<end_batch::EndBatcher>,
}

impl std::fmt::Debug for Store {
    // What identifies a store in a log line; the pool, the batcher and the
    // notifier have nothing worth printing.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("pool_size", &self.pool.status().max_size).finish()
    }
}

/// libpq's (and tokio-postgres's) idle time before the first keepalive.
const KERNEL_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// A connection whose peer vanished without a word (its host or the network
/// gone, no FIN) must fail within a minute, not hours: otherwise a worker's
/// heartbeat or the LISTEN connection waits on it for the kernel's defaults
/// (two hours of quiet before the first keepalive; ~15 minutes of
/// retransmissions for a query in flight). What the URL sets is kept.
fn detect_dead_peers(config: &mut tokio_postgres::Config) {
    if config.get_keepalives_idle() == KERNEL_KEEPALIVE_IDLE {
        config.keepalives_idle(Duration::from_secs(30));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(30));
    }
}

impl Store {
    /// Builds a pool for `database_url`. Connections are opened lazily, so
    /// this succeeds while the database is down; use [`Store::ping`] to check.
    pub fn connect(database_url: &str, max_connections: usize) -> Result<Self, StoreError> {
        let mut config =
            tokio_postgres::Config::from_str(database_url).map_err(|e| StoreError::Config(e.to_string()))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        if config.get_application_name().is_none() {
            config.application_name("kiln");
        }
        detect_dead_peers(&mut config);
        let manager =
            Manager::from_config(config.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(max_connections)
            .runtime(Runtime::Tokio1)
            // A request waiting on a pool that cannot connect should fail
            // fast with "database unavailable", not hang.
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        let notifier = std::sync::Arc::new(notifier::Notifier::new(config.clone()));
        let config = std::sync::Arc::new(config);
        Ok(Store {
            pool,
            presence_config: config.clone(),
            config,
            owner_gate: Default::default(),
            admission_lines: Default::default(),
            notifier,
            end_batcher: Default::default(),
        })
    }

    /// Sends workers' lock connections (`presence`) to `url` instead: a
    /// session-level lock needs a session of its own, so behind a pooler in
    /// transaction mode this must reach Postgres directly (or the pooler in
    /// session mode). The tests route it through a proxy they can cut.
    pub fn with_presence_url(self, url: &str) -> Result<Self, StoreError> {
        let mut presence_config =
            tokio_postgres::Config::from_str(url).map_err(|e| StoreError::Config(e.to_string()))?;
        if presence_config.get_connect_timeout().is_none() {
            presence_config.connect_timeout(Duration::from_secs(5));
        }
        detect_dead_peers(&mut presence_config);
        Ok(Store { presence_config: std::sync::Arc::new(presence_config), ..self })
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Applies pending migrations from `migrations/`. Safe to call from
    /// several processes at once (serialised by an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate::run(&self.config).await
    }

    /// A dedicated LISTEN connection that reconnects on its own.
    pub fn listener(&self) -> Listener {
        Listener::start(tokio_postgres::Config::clone(&self.config))
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Announces event `seq` of `run` to the SSE streams (after its commit;
    /// see `notifier`).
    pub(crate) fn announce_event(&self, run: uuid::Uuid, seq: i64) {
        self.notifier.notify(channels::RUN_EVENTS, format!("{run}:{seq}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_peers_are_noticed_in_seconds_unless_the_url_says_otherwise() {
        let mut config = tokio_postgres::Config::from_str("postgres://k@127.0.0.1/k").unwrap_or_else(|e| panic!("{e}"));
        detect_dead_peers(&mut config);
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(config.get_keepalives_retries(), Some(3));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(30)));

        let url = "postgres://k@127.0.0.1/k?keepalives_idle=600&keepalives_interval=5&keepalives_retries=9&tcp_user_timeout=90";
        let mut config = tokio_postgres::Config::from_str(url).unwrap_or_else(|e| panic!("{e}"));
        detect_dead_peers(&mut config);
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(600));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(5)));
        assert_eq!(config.get_keepalives_retries(), Some(9));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(90)));
    }
}
