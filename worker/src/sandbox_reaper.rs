//! Which of Kiln's containers on the engine nobody will use again, and
//! removing them: sessions idle past `KILN_SANDBOX_IDLE_S`, warm containers
//! of workers that are gone, and containers of older Kiln versions whose run
//! is over, and loop disks whose container is gone. Containers this database knows nothing of belong to another
//! deployment sharing the engine and are left alone.

use std::time::Duration;

use chrono::Utc;
use kiln_protocol::RunStatus;
use kiln_store::{Store, WorkerPresence};

use crate::egress::host_firewall::HostFirewall;
use crate::sandbox::{Backend, Managed, SandboxConfig};

/// What the reaper needs to decide.
pub struct ReapPolicy<'a> {
    /// This worker: its own warm containers are its pool's business...
    pub worker: &'a str,
    /// ...unless they are from before this process started (a restart
    /// under the same `KILN_WORKER_ID`).
    pub at_start: bool,
    pub idle: Duration,
    /// A worker not seen for this long is gone.
    pub worker_gone_after: Duration,
    /// Whose rules go with a session's network.
    pub firewall: &'a HostFirewall,
    /// This worker's sandboxes: what the backend's sweep of their
    /// leftovers looks at (Docker: where their loop disks live).
    pub sandbox: &'a SandboxConfig,
}

/// One pass over the backend's Kiln sandboxes. Errors are logged: a pass
/// that fails is retried at the next tick.
pub async fn reap(sandboxes: &Backend, store: &Store, policy: &ReapPolicy<'_>) {
    let containers = match sandboxes.list_managed().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "listing sandboxes failed");
            return;
        }
    };
    for container in containers {
        match should_remove(store, policy, &container).await {
            Ok(Some(why)) => {
                tracing::info!(container = %container.id, session = ?container.session, why, "removing sandbox");
                sandboxes.remove(&container.id).await;
                if let Some(session) = container.session {
                    sandboxes.remove_session_network(policy.firewall, session).await;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(container = %container.id, error = %e, "checking a sandbox failed"),
        }
    }
    // What sandboxes removed without Kiln left (a worker that crashed, or
    // an operator's `docker rm`: their loop disks).
    sandboxes.sweep_leftovers(policy.sandbox).await;
}

async fn should_remove(
    store: &Store,
    policy: &ReapPolicy<'_>,
    c: &Managed,
) -> Result<Option<&'static str>, kiln_store::StoreError> {
    // `pool_worker` is only set on containers not bound to a session: once
    // bound, a container is the session's, whoever warmed it.
    if let Some(worker) = &c.pool_worker {
        if worker == policy.worker {
            return Ok(policy.at_start.then_some("warm container of this worker's previous process"));
        }
        let presence = store.worker_presence(worker, policy.worker_gone_after).await?;
        return Ok((presence == WorkerPresence::Gone).then_some("warm container of a worker that is gone"));
    }
    if let Some(session) = c.session {
        let Some(activity) = store.session_activity(session).await? else { return Ok(None) };
        if activity.active {
            return Ok(None);
        }
        let idle_for = activity.last_finished_at.and_then(|t| (Utc::now() - t).to_std().ok()).unwrap_or_default();
        return Ok((idle_for >= policy.idle).then_some("session idle"));
    }
    if let Some(run) = c.run {
        let Some(run) = store.get_run_unscoped(run).await? else { return Ok(None) };
        let over = !matches!(run.status, RunStatus::Queued | RunStatus::Running | RunStatus::AwaitingApproval);
        return Ok(over.then_some("its run is over"));
    }
    Ok(None)
}

/// How often to look: often enough that an idle limit of a few seconds is
/// kept roughly, rarely enough not to load the engine.
pub fn interval(idle: Duration) -> Duration {
    (idle / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Removes every container on the engine bound to a session of this
/// database that has no run queued or running; how many went.
pub async fn remove_idle_sessions(sandboxes: &Backend, store: &Store, firewall: &HostFirewall) -> usize {
    let containers = match sandboxes.list_managed().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "listing sandboxes failed");
            return 0;
        }
    };
    let mut removed = 0;
    for container in containers {
        let Some(session) = container.session else { continue };
        match store.session_activity(session).await {
            // Unknown here: another deployment's.
            Ok(None) => {}
            Ok(Some(activity)) if activity.active => {}
            Ok(Some(_)) => {
                tracing::info!(container = %container.id, %session, "removing idle session sandbox");
                sandboxes.remove(&container.id).await;
                // Its network (and the host's rules for it) with it.
                sandboxes.remove_session_network(firewall, session).await;
                removed += 1;
            }
            Err(e) => tracing::warn!(container = %container.id, error = %e, "checking a sandbox failed"),
        }
    }
    removed
}
