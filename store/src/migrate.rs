//! Migrations: plain SQL files in `migrations/`, embedded at build time and
//! applied with refinery.

use tokio_postgres::NoTls;

use crate::StoreError;

mod embedded {
    refinery::embed_migrations!("../migrations");
}

/// Arbitrary constant naming Kiln's migration advisory lock.
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_0001;

pub(crate) async fn run(config: &tokio_postgres::Config) -> Result<(), StoreError> {
    let (mut client, connection) = config.connect(NoTls).await?;
    let conn_task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "migration connection closed");
        }
    });
    // `serve` and `worker` may start together; the lock makes the second
    // wait for the first instead of racing it on refinery's history table.
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let report = embedded::migrations::runner().set_abort_divergent(true).run_async(&mut client).await;
    let unlock = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await;
    drop(client);
    conn_task.abort();
    let report = report.map_err(|e| StoreError::Migration(e.to_string()))?;
    unlock?;
    for m in report.applied_migrations() {
        tracing::info!(migration = %m, "applied migration");
    }
    Ok(())
}
