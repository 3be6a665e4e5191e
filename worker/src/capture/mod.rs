//! The capture phase (issue 28): what a run changed in its workspace, taken
//! inside the sandbox when the run ends, whatever the end (succeeded,
//! failed, cancelled, timed out; not a run handed back or lost, whose next
//! attempt captures). Its processes are killed first, so nothing changes
//! the workspace while or after it is taken. Two changes are kept
//! (`run_changes`): the run's own, from its base ([`base`]), and the
//! session's, from the session's first base. The patch is read back within
//! `KILN_MAX_PATCH_MB`: over it only the per-file summary is kept, marked
//! `too_large`. A capture that fails is logged and leaves no change; it
//! never changes how the run ended.

pub mod base;
mod count;
mod script;
mod summary;

pub use self::script::Way;
pub use crate::vouches::{Vouch, Vouches};

use kiln_protocol::changes::{ChangeScope, ChangeTotals};
use kiln_protocol::{EventBody, Run};
use kiln_store::{CapturedChange, Lease, RunBase, StoreError};

use crate::context::WorkerContext;
use crate::event_sink::EventSink;
use crate::sandbox::{Sandbox, lifecycle};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("stopping the run's processes: {0}")]
    Kill(String),
    #[error("in the sandbox: {0}")]
    Sandbox(String),
    #[error("the capture failed in the sandbox (exit {code:?}): {output}")]
    Script { code: Option<i64>, output: String },
    /// The image lacks what the capture runs.
    #[error("the change capture needs {0} in the sandbox image")]
    Needs(&'static str),
    #[error("the sandbox answered garbage: {0}")]
    Garbage(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Captures and stores the run's change, and queues `changes.captured`
/// (written with the run's last events, before the terminal one).
pub async fn capture_change(ctx: &WorkerContext, run: &Run, lease: &Lease, events: &mut EventSink) {
    match capture(ctx, run, lease).await {
        Ok(Some((totals, too_large))) => {
            let body = EventBody::ChangesCaptured {
                files: totals.files,
                additions: totals.additions,
                deletions: totals.deletions,
                too_large,
            };
            if let Err(e) = events.write_soon(body).await {
                tracing::warn!(run_id = %run.id, error = %e, "recording changes.captured failed");
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(run_id = %run.id, error = %e, "capturing the run's change failed; it has none"),
    }
}

/// The run's own change's totals and whether its patch was too large;
/// `None` when the run has no workspace (no base, or no container).
async fn capture(ctx: &WorkerContext, run: &Run, lease: &Lease) -> Result<Option<(ChangeTotals, bool)>, CaptureError> {
    let held = ctx.held_sandboxes.take(run.id);
    let Some(base) = ctx.store.run_base(run.id).await? else { return Ok(None) };
    // The run's own handle, its toolbox's connection open; else (a run that
    // never got that far, or came back to this worker) one bound by name.
    let sandbox = match held {
        Some(sandbox) => sandbox,
        None => match lifecycle::running(&ctx.sandboxes, &ctx.config.sandbox, run.session_id).await {
            Some(sandbox) => sandbox,
            None => return Ok(None),
        },
    };
    sandbox.kill_user_processes().await.map_err(|e| CaptureError::Kill(e.to_string()))?;
    let vouch = ctx.capture_vouches.get(run.session_id);
    let started = std::time::Instant::now();
    let Captured { own, session, vouch, way } = take(&sandbox, &base, ctx.config.max_patch_bytes, &vouch).await?;
    tracing::info!(
        run_id = %run.id,
        way = way.as_str(),
        files = own.totals.files,
        patch_bytes = own.patch_bytes,
        took_ms = started.elapsed().as_millis() as u64,
        "took the run's change"
    );
    ctx.capture_vouches.set(run.session_id, vouch);
    ctx.store.save_run_changes(lease, &own).await?;
    ctx.store.save_run_changes(lease, &session).await?;
    Ok(Some((own.totals, own.too_large)))
}

/// What a capture took.
#[derive(Debug)]
pub struct Captured {
    /// The run's own change.
    pub own: CapturedChange,
    /// The session's, from its first base.
    pub session: CapturedChange,
    /// What the session's next capture may take on trust.
    pub vouch: Vouch,
    /// How it ran.
    pub way: Way,
}

/// The run's own change and the session's, taken in `sandbox` from `base`
/// and read back within `max_patch` bytes each, given what the session's
/// last capture left ([`Vouch`]), and what this one leaves: the capture
/// without the store (the `capture` benchmark times exactly this).
pub async fn take(sandbox: &Sandbox, base: &RunBase, max_patch: u64, vouch: &Vouch) -> Result<Captured, CaptureError> {
    let taken = script::take(sandbox, &base.base, &base.session_base, max_patch, vouch).await?;
    let own = change(ChangeScope::Run, &base.base_commit, &taken.tree, taken.run);
    let session = match taken.session {
        Some(session) => change(ChangeScope::Session, &base.session_base_commit, &taken.tree, session),
        None => CapturedChange { scope: ChangeScope::Session, ..own.clone() },
    };
    Ok(Captured { own, session, vouch: taken.vouch, way: taken.way })
}

fn change(scope: ChangeScope, base_commit: &Option<String>, tree: &str, sent: script::Scope) -> CapturedChange {
    let (files, totals) = summary::summarise(&sent.summary, sent.counted.as_deref());
    CapturedChange {
        scope,
        base_commit: base_commit.clone(),
        tree: Some(tree.to_owned()),
        files,
        totals,
        too_large: sent.patch.is_none(),
        patch_bytes: sent.patch_bytes,
        patch: sent.patch,
    }
}
