use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("invalid database configuration: {0}")]
    Config(String),
    /// The database could not be reached (pool timeout, connection refused).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(String),
    /// A fenced write found the lease gone: the run was reclaimed or ended.
    #[error("lease lost: run {0} is no longer held by this worker at this attempt")]
    LeaseLost(uuid::Uuid),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

impl StoreError {
    /// True when the database itself is unreachable (as opposed to a query
    /// failing), so callers can answer 503 rather than 500.
    pub fn is_unavailable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Db(e) => match e.as_db_error() {
                None => true,
                // The server is shutting down or starting up: it will be back.
                Some(db) => {
                    e.is_closed()
                        || [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW]
                            .contains(db.code())
                }
            },
            _ => false,
        }
    }
}
