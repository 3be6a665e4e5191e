//! The phases that give a run its sandbox: get the container (the
//! session's, one prepared by the run's environment, a warm one or a new
//! one), then fill its workspace and say it is ready.

use kiln_protocol::{EventBody, Run, SandboxSpec};
use kiln_store::Lease;

use super::PhaseError;
use crate::capture::base::Workspace;
use crate::context::WorkerContext;
use crate::event_sink::EventSink;
use crate::local_checkout::LocalCheckout;
use crate::mcp::EnvironmentServers;
use crate::sandbox::lifecycle::{self, Origin};
use crate::sandbox::pool::WarmPool;
use crate::sandbox::{Owner, Sandbox, SandboxConfig, SandboxError};

/// Told to the model when a run continues a conversation in a sandbox that
/// is not the one the conversation happened in.
const FRESH_SANDBOX_NOTE: &str = "[kiln] The sandbox was recreated (the session's earlier container was gone): files \
     and processes from earlier in this session are lost, and the workspace is a fresh checkout. Check the state \
     of any file before relying on earlier work.";

/// The run's container, its workspace not filled yet.
pub struct Acquired {
    pub sandbox: Sandbox,
    pub origin: Origin,
    pub config: SandboxConfig,
    /// The repository on the worker's side, when the workspace is fresh.
    checkout: Option<LocalCheckout>,
    /// An environment prepared the sandbox and brought the workspace in.
    with_environment: bool,
    pub environment_mcp: EnvironmentServers,
}

/// The run's sandbox, ready for the agent.
pub struct Ready {
    pub sandbox: Sandbox,
    /// Told to the model before its first step (a recreated sandbox).
    pub notice: Option<String>,
    pub environment_mcp: EnvironmentServers,
}

/// Gets the run's container. A session that still has its container
/// continues in it. Otherwise the repository is checked out on the
/// worker's side first: it says which environment the run gets when the
/// run names none (`.kiln/environment.toml`), and a run with an
/// environment gets its sandbox prepared by it (a warm container is of the
/// bare image: no use there).
pub async fn acquire(
    ctx: &WorkerContext,
    pool: Option<&WarmPool>,
    run: &Run,
    events: &mut EventSink,
) -> Result<Acquired, PhaseError> {
    let owner = Owner { run_id: run.id, session_id: run.session_id, worker: ctx.config.worker_id.clone() };
    let config = ctx.config.sandbox.narrowed(&run.sandbox).map_err(PhaseError::failed)?;
    // Warm containers have the deployment's settings; a run that narrows
    // them gets its own.
    let pool = pool.filter(|_| run.sandbox == SandboxSpec::default());
    let fresh = !lifecycle::has_container(&ctx.sandboxes, run.session_id).await;
    let checkout = match fresh {
        true => crate::local_checkout::make(ctx, run).await.map_err(workspace_failed)?,
        false => None,
    };
    let checkout_path = checkout.as_ref().map(|c| c.path());
    let source = match fresh {
        true => crate::environment::source_of(run, checkout_path).await.map_err(PhaseError::failed)?,
        false => None,
    };
    let with_environment = source.is_some();
    // Read before `source` goes to `prepare`; opened only at connection.
    let environment_mcp = crate::environment::mcp::servers_of(ctx, run, source.as_ref()).await?;
    let (sandbox, origin) = match source {
        Some(source) => {
            match crate::environment::prepare(ctx, run, source, checkout_path, &config, &owner, events).await? {
                crate::environment::Prepared::Ready(sandbox, origin) => (*sandbox, origin),
                crate::environment::Prepared::Failed(outcome) => return Err(PhaseError::Ended(outcome)),
            }
        }
        None => lifecycle::acquire(&ctx.sandboxes, &config, pool, &owner)
            .await
            .map_err(|e| PhaseError::failed(format!("could not start the sandbox: {e}")))?,
    };
    Ok(Acquired { sandbox, origin, config, checkout, with_environment, environment_mcp })
}

/// Brings the repository into a sandbox that does not have it yet, records
/// where the run's change is taken from, and says the sandbox is ready.
pub async fn fill_workspace(
    ctx: &WorkerContext,
    run: &Run,
    lease: &Lease,
    acquired: Acquired,
    events: &mut EventSink,
) -> Result<Ready, PhaseError> {
    let Acquired { sandbox, origin, config, checkout, with_environment, environment_mcp } = acquired;
    let mut notice = None;
    let mut workspace = Workspace::Continued;
    if origin != Origin::Reused {
        // An environment brought the workspace in itself.
        let prepared = match with_environment {
            true => Ok(checkout.as_ref().and_then(|c| c.commit())),
            false => upload_checkout(ctx, run, checkout, &sandbox).await,
        };
        match prepared {
            Ok(commit) => workspace = Workspace::Fresh { commit },
            Err(e) => {
                // A half-filled workspace must not be what a follow-up finds.
                sandbox.remove().await;
                return Err(workspace_failed(e));
            }
        }
        // A takeover or a follow-up whose container is gone: the
        // conversation talks about files this sandbox does not have.
        if ctx.store.count_session_messages(run.session_id).await? > 0 {
            notice = Some(FRESH_SANDBOX_NOTE.to_owned());
        }
    }
    // Where the run's change is taken from at its end.
    crate::capture::base::record(ctx, run, lease, workspace).await?;
    events
        .write_now(EventBody::SandboxReady {
            container: sandbox.id().to_owned(),
            image: sandbox.image().to_owned(),
            origin: Some(origin.as_str().to_owned()),
            workspace_lost: notice.is_some(),
            disk: config.disk_plan.get().map(|plan| plan.mechanism.as_str().to_owned()),
        })
        .await?;
    Ok(Ready { sandbox, notice, environment_mcp })
}

/// Puts the run's repository into a new sandbox: the checkout made before
/// it, or one made now (the session's container went between the look and
/// the start). The commit checked out; `None`: no repository.
async fn upload_checkout(
    ctx: &WorkerContext,
    run: &Run,
    checkout: Option<LocalCheckout>,
    sandbox: &Sandbox,
) -> Result<Option<String>, SandboxError> {
    let checkout = match checkout {
        Some(c) => Some(c),
        None => crate::local_checkout::make(ctx, run).await?,
    };
    let Some(checkout) = checkout else { return Ok(None) };
    sandbox.upload_dir(checkout.path(), ctx.config.clone_settings().max_bytes).await?;
    Ok(checkout.commit())
}

fn workspace_failed(e: SandboxError) -> PhaseError {
    PhaseError::failed(format!("could not prepare the workspace: {e}"))
}
