//! The database: where it is and how many connections this process holds.

use anyhow::Context;
use clap::Args;
use secrecy::SecretString;

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// Postgres connection URL. `kiln up` starts a local cluster when unset.
    /// A secret (it holds the password): exposed only to connect.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<SecretString>,
    /// Connections in this process's pool.
    #[arg(long, env = "KILN_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,
}

impl DbArgs {
    pub fn url(&self) -> anyhow::Result<&SecretString> {
        self.database_url.as_ref().context("DATABASE_URL is not set (e.g. postgres://user:pass@127.0.0.1:5432/kiln)")
    }
}
