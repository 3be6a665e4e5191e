//! Environments, scoped by owner like runs: one subject never reads,
//! changes or names another's. Secrets arrive here already sealed
//! ([`crate::secrets`]); the store never sees their plaintext.

use std::collections::BTreeMap;

use kiln_protocol::mcp::McpServerView;
use kiln_protocol::{Environment, EnvironmentSpec, SandboxSpec};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Store, StoreError};

/// Environments one subject may hold.
pub const MAX_ENVIRONMENTS_PER_OWNER: i64 = 100;

/// What the secrets of a write become.
pub enum SecretsWrite {
    /// Keep what is stored (an update without `secrets`).
    Keep,
    /// Store these: names in clear, values sealed (`None`: no secrets).
    Set { names: Vec<String>, sealed: Option<Vec<u8>> },
}

/// An environment's MCP servers as stored: what the API shows of each, and
/// the sealed headers of those that have some (by server name). Sealed
/// before the store sees them, like secrets.
#[derive(Debug, Clone, Default)]
pub struct McpServersWrite {
    pub servers: BTreeMap<String, McpServerView>,
    pub headers_sealed: BTreeMap<String, Vec<u8>>,
}

/// Why a write did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvironmentRefusal {
    NotFound,
    NameTaken,
    TooMany,
}

/// An environment with its sealed secrets: what a worker prepares a run with.
#[derive(Debug, Clone)]
pub struct StoredEnvironment {
    pub environment: Environment,
    pub secrets_sealed: Option<Vec<u8>>,
    /// Server name → its headers, sealed ([`crate::secrets::Sealed::mcp_headers`]).
    pub mcp_headers_sealed: BTreeMap<String, Vec<u8>>,
}

const COLUMNS: &str = "id, name, image, setup_script, maintenance_script, variables, secret_names, lock_files, \
     setup_sandbox, cache_generation, created_at, updated_at, secrets_sealed, mcp_servers, mcp_headers_sealed";

fn from_row(row: &Row) -> Result<StoredEnvironment, StoreError> {
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt(format!("environments.{what}: {e}"));
    let variables: serde_json::Value = row.try_get(5)?;
    let lock_files: serde_json::Value = row.try_get(7)?;
    let setup_sandbox: serde_json::Value = row.try_get(8)?;
    let mcp_servers: serde_json::Value = row.try_get(13)?;
    let mcp_headers: serde_json::Value = row.try_get(14)?;
    let mcp_headers: BTreeMap<String, String> =
        serde_json::from_value(mcp_headers).map_err(|e| corrupt("mcp_headers_sealed", e))?;
    let mcp_headers_sealed = mcp_headers
        .into_iter()
        .map(|(server, sealed)| hex::decode(sealed).map(|bytes| (server, bytes)))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("environments.mcp_headers_sealed: {e}")))?;
    Ok(StoredEnvironment {
        environment: Environment {
            id: row.try_get(0)?,
            name: row.try_get(1)?,
            image: row.try_get(2)?,
            setup_script: row.try_get(3)?,
            maintenance_script: row.try_get(4)?,
            variables: serde_json::from_value(variables).map_err(|e| corrupt("variables", e))?,
            secret_names: row.try_get(6)?,
            lock_files: serde_json::from_value(lock_files).map_err(|e| corrupt("lock_files", e))?,
            setup_sandbox: serde_json::from_value::<SandboxSpec>(setup_sandbox)
                .map_err(|e| corrupt("setup_sandbox", e))?,
            cache_generation: row.try_get(9)?,
            mcp_servers: serde_json::from_value(mcp_servers).map_err(|e| corrupt("mcp_servers", e))?,
            created_at: row.try_get(10)?,
            updated_at: row.try_get(11)?,
        },
        secrets_sealed: row.try_get(12)?,
        mcp_headers_sealed,
    })
}

/// The JSON columns of a spec.
fn json_columns(spec: &EnvironmentSpec) -> Result<[serde_json::Value; 3], StoreError> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| StoreError::Corrupt(e.to_string()));
    Ok([
        json(serde_json::to_value(&spec.variables))?,
        json(serde_json::to_value(spec.lock_files()))?,
        json(serde_json::to_value(spec.setup_sandbox.clone().unwrap_or_default()))?,
    ])
}

/// The two MCP columns of a write.
fn mcp_columns(mcp: &McpServersWrite) -> Result<[serde_json::Value; 2], StoreError> {
    let sealed: BTreeMap<&String, String> = mcp.headers_sealed.iter().map(|(k, v)| (k, hex::encode(v))).collect();
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| StoreError::Corrupt(e.to_string()));
    Ok([json(serde_json::to_value(&mcp.servers))?, json(serde_json::to_value(sealed))?])
}

impl Store {
    /// Creates `owner`'s environment `spec.name` with the id `id` (the
    /// caller's: its sealed values are bound to it, see
    /// [`crate::secrets::Sealed`]).
    pub async fn create_environment(
        &self,
        id: Uuid,
        owner: &str,
        spec: &EnvironmentSpec,
        secrets: SecretsWrite,
        mcp: &McpServersWrite,
    ) -> Result<Result<Environment, EnvironmentRefusal>, StoreError> {
        let [mcp_servers, mcp_headers] = mcp_columns(mcp)?;
        let (names, sealed) = match secrets {
            SecretsWrite::Set { names, sealed } => (names, sealed),
            SecretsWrite::Keep => (Vec::new(), None),
        };
        let [variables, lock_files, setup_sandbox] = json_columns(spec)?;
        // The count and the insert in one statement: concurrent creations
        // can at worst both pass the count, never loop past it.
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "INSERT INTO environments (id, owner, name, image, setup_script, maintenance_script, variables,
                                               secret_names, secrets_sealed, lock_files, setup_sandbox,
                                               mcp_servers, mcp_headers_sealed)
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $13, $14
                     WHERE (SELECT count(*) FROM environments WHERE owner = $2) < $12
                     ON CONFLICT (owner, name) DO NOTHING
                     RETURNING {COLUMNS}"
                ),
                &[
                    &id,
                    &owner,
                    &spec.name,
                    &spec.image,
                    &spec.setup_script,
                    &spec.maintenance_script,
                    &variables,
                    &names,
                    &sealed,
                    &lock_files,
                    &setup_sandbox,
                    &MAX_ENVIRONMENTS_PER_OWNER,
                    &mcp_servers,
                    &mcp_headers,
                ],
            )
            .await?;
        if let Some(row) = row {
            return Ok(Ok(from_row(&row)?.environment));
        }
        Ok(Err(match self.environment(owner, &spec.name).await? {
            Some(_) => EnvironmentRefusal::NameTaken,
            None => EnvironmentRefusal::TooMany,
        }))
    }

    /// `owner`'s environment `name`, with its sealed secrets.
    pub async fn environment(&self, owner: &str, name: &str) -> Result<Option<StoredEnvironment>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&format!("SELECT {COLUMNS} FROM environments WHERE owner = $1 AND name = $2"), &[&owner, &name])
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// The environment `name` of the owner of run `run_id`: what a worker
    /// prepares the run's sandbox with (it knows the run, not its owner).
    pub async fn environment_of_run(&self, run_id: Uuid, name: &str) -> Result<Option<StoredEnvironment>, StoreError> {
        let client = self.client().await?;
        let columns = COLUMNS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ");
        let row = client
            .query_opt(
                &format!(
                    "SELECT {columns} FROM environments e JOIN runs r ON r.owner = e.owner
                     WHERE r.id = $1 AND e.name = $2"
                ),
                &[&run_id, &name],
            )
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// The owner of run `run_id` (the associated data its environment's
    /// secrets were sealed with).
    pub async fn run_owner(&self, run_id: Uuid) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT owner FROM runs WHERE id = $1", &[&run_id]).await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// `owner`'s environments by name (at most [`MAX_ENVIRONMENTS_PER_OWNER`]).
    pub async fn list_environments(&self, owner: &str) -> Result<Vec<Environment>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {COLUMNS} FROM environments WHERE owner = $1 ORDER BY name LIMIT $2"),
                &[&owner, &MAX_ENVIRONMENTS_PER_OWNER],
            )
            .await?;
        rows.iter().map(|r| from_row(r).map(|s| s.environment)).collect()
    }

    /// Replaces `owner`'s environment `name` with `spec` (which may rename
    /// it), if it is still the environment `id` (what the write's values
    /// were sealed for): one deleted and made again under the same name
    /// meanwhile is [`EnvironmentRefusal::NotFound`].
    pub async fn update_environment(
        &self,
        id: Uuid,
        owner: &str,
        name: &str,
        spec: &EnvironmentSpec,
        secrets: SecretsWrite,
        mcp: &McpServersWrite,
    ) -> Result<Result<Environment, EnvironmentRefusal>, StoreError> {
        let [mcp_servers, mcp_headers] = mcp_columns(mcp)?;
        let (keep, names, sealed) = match secrets {
            SecretsWrite::Keep => (true, Vec::new(), None),
            SecretsWrite::Set { names, sealed } => (false, names, sealed),
        };
        let [variables, lock_files, setup_sandbox] = json_columns(spec)?;
        let client = self.client().await?;
        let updated = client
            .query_opt(
                &format!(
                    "UPDATE environments SET name = $3, image = $4, setup_script = $5, maintenance_script = $6,
                         variables = $7, lock_files = $8, setup_sandbox = $9,
                         secret_names = CASE WHEN $10 THEN secret_names ELSE $11 END,
                         secrets_sealed = CASE WHEN $10 THEN secrets_sealed ELSE $12 END,
                         mcp_servers = $13, mcp_headers_sealed = $14,
                         updated_at = now()
                     WHERE owner = $1 AND name = $2 AND id = $15
                     RETURNING {COLUMNS}"
                ),
                &[
                    &owner,
                    &name,
                    &spec.name,
                    &spec.image,
                    &spec.setup_script,
                    &spec.maintenance_script,
                    &variables,
                    &lock_files,
                    &setup_sandbox,
                    &keep,
                    &names,
                    &sealed,
                    &mcp_servers,
                    &mcp_headers,
                    &id,
                ],
            )
            .await;
        match updated {
            Ok(Some(row)) => {
                let environment = from_row(&row)?.environment;
                notify_changed(&client, environment.id).await;
                Ok(Ok(environment))
            }
            Ok(None) => Ok(Err(EnvironmentRefusal::NotFound)),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                Ok(Err(EnvironmentRefusal::NameTaken))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes `owner`'s environment `name`; `false` when there was none.
    pub async fn delete_environment(&self, owner: &str, name: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("DELETE FROM environments WHERE owner = $1 AND name = $2 RETURNING id", &[&owner, &name])
            .await?;
        let Some(row) = row else { return Ok(false) };
        notify_changed(&client, row.try_get("id")?).await;
        Ok(true)
    }

    /// Raises the environment's cache generation: every prepared sandbox
    /// made before misses from now on.
    pub async fn reset_environment_cache(&self, owner: &str, name: &str) -> Result<Option<Environment>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE environments SET cache_generation = cache_generation + 1, updated_at = now()
                     WHERE owner = $1 AND name = $2 RETURNING {COLUMNS}"
                ),
                &[&owner, &name],
            )
            .await?;
        let environment = row.as_ref().map(|r| from_row(r).map(|s| s.environment)).transpose()?;
        if let Some(environment) = &environment {
            notify_changed(&client, environment.id).await;
        }
        Ok(environment)
    }
}

/// Tells workers that the environment's prepared sandboxes are stale
/// (`channels::ENVIRONMENT_CHANGED`), so they drop its warm containers. The
/// change is stored already; a lost notice leaves those containers until
/// their pool is the coldest (they are never used: the cache key moved on).
async fn notify_changed(client: &tokio_postgres::Client, id: Uuid) {
    let payload = id.to_string();
    if let Err(e) = client.execute("SELECT pg_notify($1, $2)", &[&crate::channels::ENVIRONMENT_CHANGED, &payload]).await
    {
        tracing::warn!(environment = %id, error = %e, "notifying workers of a changed environment failed");
    }
}
