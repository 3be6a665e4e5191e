//! One environment setup per cache key at a time, across workers.
//!
//! The attempts of a group start together and name the same environment:
//! without this, each would miss the cache and run setup. The first to
//! miss takes the key's lock and sets up; the others wait on the lock,
//! look again and find the prepared image (issue 29: "an environment is set
//! up at most once and served to all from its cache").

use tokio_postgres::NoTls;

use crate::{Store, StoreError};

/// Held while a run sets up the environment of one cache key. A
/// session-level advisory lock on a connection of its own (like the
/// workers' presence locks, so behind a pooler it takes the same direct
/// route); dropping the guard closes the connection, which releases the
/// lock however the holder ended.
pub struct SetupLock {
    _client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for SetupLock {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl Store {
    /// Waits for, then takes, the setup lock of environment cache key `key`.
    pub async fn lock_environment_setup(&self, key: &str) -> Result<SetupLock, StoreError> {
        let mut config = tokio_postgres::Config::clone(&self.presence_config);
        config.application_name("kiln-environment-setup");
        let (client, connection) = config.connect(NoTls).await.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let connection = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "an environment setup lock's connection failed");
            }
        });
        // A class of its own (29) beside the other advisory locks' keys.
        client.execute("SELECT pg_advisory_lock(29, hashtext($1))", &[&key]).await?;
        Ok(SetupLock { _client: client, connection })
    }
}
