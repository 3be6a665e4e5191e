//! A warm pool per hot environment: containers started from a prepared
//! image with its restore already done (setup's workspace and home put
//! back), so a run on that environment only moves the workspace to its
//! commit and runs the maintenance script.
//!
//! Each environment's containers are a [`WarmPool`] of their own (the
//! deployment's pool, given the prepared image and the restore command).
//! Pools are kept for the environments used most recently, never more than
//! `max_containers` containers in all (`KILN_ENVIRONMENT_WARM_MAX`): a
//! burst of distinct environments replaces pools, it never adds containers.
//! A pool goes when its image is evicted (`cache::evict`), when its
//! environment's cache is reset or the environment changes (a notice from
//! the API), and when the worker stops.
//!
//! A pool is keyed by the cache key, which holds the run's owner and
//! repository (see `key`): a warm container only ever serves runs of the
//! tenant and repository its prepared image was made for.
//!
//! The containers carry nothing of setup's secrets (the prepared image
//! never holds them) and have the deployment's limits and no network, as
//! the agent phase of a run that narrows nothing: only such runs take
//! from these pools.

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::sandbox::SandboxConfig;
use crate::sandbox::backend::Backend;
use crate::sandbox::pool::WarmPool;

/// How many containers are kept warm (`KILN_ENVIRONMENT_WARM`,
/// `KILN_ENVIRONMENT_WARM_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmSettings {
    /// Per hot environment; 0 turns the pools off.
    pub per_environment: usize,
    /// In all, over every environment this worker keeps warm.
    pub max_containers: usize,
}

impl Default for WarmSettings {
    fn default() -> Self {
        WarmSettings { per_environment: 1, max_containers: 4 }
    }
}

impl WarmSettings {
    /// Containers per pool and pools kept, within the total.
    fn shape(&self) -> (usize, usize) {
        let per = self.per_environment.min(self.max_containers);
        if per == 0 {
            return (0, 0);
        }
        (per, self.max_containers / per)
    }
}

struct Entry {
    /// The cache key (the image is `kiln-env:<key>`): owner and
    /// repository included.
    key: String,
    environment: Uuid,
    pool: Arc<WarmPool>,
    stop: CancellationToken,
    /// Fills the pool, then removes what it holds when stopped.
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Pools {
    /// Least recently used first.
    entries: Vec<Entry>,
    /// The worker is stopping: no new pools.
    closed: bool,
}

pub struct EnvironmentPools {
    backend: Backend,
    worker: String,
    settings: WarmSettings,
    pools: Mutex<Pools>,
}

impl EnvironmentPools {
    pub fn new(backend: impl Into<Backend>, worker: String, settings: WarmSettings) -> Self {
        EnvironmentPools { backend: backend.into(), worker, settings, pools: Mutex::default() }
    }

    /// The warm pool of the prepared image of `key`, made (and starting to
    /// fill) if there is none; `None` when pools are off or the worker is
    /// stopping. `config` is the agent phase's sandbox with the prepared
    /// image; `restore` the command that puts setup's trees back.
    pub fn pool_for(
        &self,
        key: &str,
        environment: Uuid,
        config: &SandboxConfig,
        restore: &str,
    ) -> Option<Arc<WarmPool>> {
        let (per, kept) = self.settings.shape();
        if per == 0 {
            return None;
        }
        let mut pools = lock(&self.pools);
        if pools.closed {
            return None;
        }
        if let Some(at) = pools.entries.iter().position(|e| e.key == key) {
            let entry = pools.entries.remove(at);
            let pool = entry.pool.clone();
            pools.entries.push(entry);
            return Some(pool);
        }
        // Room first: the pools let go finish removing their containers
        // before the new one starts any, so the bound holds on the engine.
        let mut before = Vec::new();
        while pools.entries.len() >= kept.max(1) {
            let old = pools.entries.remove(0);
            tracing::info!(key = %old.key, "a colder environment's warm pool makes room");
            old.stop.cancel();
            before.push(old.task);
        }
        let pool = Arc::new(WarmPool::of_environment(
            &self.backend,
            config.clone(),
            self.worker.clone(),
            per,
            restore.to_owned(),
        ));
        let stop = CancellationToken::new();
        let task = {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                for task in before {
                    let _ = task.await;
                }
                pool.run(stop).await;
            })
        };
        pools.entries.push(Entry { key: key.to_owned(), environment, pool: pool.clone(), stop, task });
        Some(pool)
    }

    /// Lets go of the pool of `key` and waits until its containers are gone.
    pub async fn forget_key(&self, key: &str) {
        self.forget(|e| e.key == key).await;
    }

    /// Lets go of every pool of `environment` (its cache was reset, it was
    /// changed or deleted) and waits until their containers are gone.
    pub async fn forget_environment(&self, environment: Uuid) {
        self.forget(|e| e.environment == environment).await;
    }

    async fn forget(&self, which: impl Fn(&Entry) -> bool) {
        let gone: Vec<Entry> = {
            let mut pools = lock(&self.pools);
            let (gone, kept) = std::mem::take(&mut pools.entries).into_iter().partition(|e| which(e));
            pools.entries = kept;
            gone
        };
        for entry in gone {
            tracing::info!(key = %entry.key, "removing an environment's warm pool");
            entry.stop.cancel();
            let _ = entry.task.await;
        }
    }

    /// Stops every pool and waits until their containers are gone; no pool
    /// is made afterwards.
    pub async fn shutdown(&self) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut pools = lock(&self.pools);
            pools.closed = true;
            let mut tasks = Vec::new();
            for entry in std::mem::take(&mut pools.entries) {
                entry.stop.cancel();
                tasks.push(entry.task);
            }
            tasks
        };
        for task in tasks {
            let _ = task.await;
        }
    }
}

fn lock(m: &Mutex<Pools>) -> std::sync::MutexGuard<'_, Pools> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_bounds_how_many_environments_are_kept_warm() {
        let shape = |per, max| WarmSettings { per_environment: per, max_containers: max }.shape();
        assert_eq!(shape(1, 4), (1, 4));
        assert_eq!(shape(2, 5), (2, 2));
        assert_eq!(shape(3, 2), (2, 1), "one pool never exceeds the total");
        assert_eq!(shape(0, 4), (0, 0));
        assert_eq!(shape(1, 0), (0, 0));
    }
}
