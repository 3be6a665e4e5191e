//! The phase that drives the agent: the run's `AgentRun`, built from the
//! worker's settings and the run's, driven to its outcome.

use std::sync::Arc;

use kiln_protocol::Run;
use kiln_store::Lease;

use super::connect::Tools;
use crate::agent::control::Control;
use crate::agent::{AgentError, AgentRun, Outcome};
use crate::context::WorkerContext;
use crate::event_sink::EventSink;
use crate::sandbox::Sandbox;

pub async fn drive(
    ctx: &Arc<WorkerContext>,
    run: &Run,
    lease: &Lease,
    sandbox: &Sandbox,
    tools: Tools,
    events: &mut EventSink,
    control: Arc<Control>,
) -> Result<Outcome, AgentError> {
    let kind = run.model.provider.as_deref().and_then(|p| p.parse().ok()).unwrap_or(ctx.config.default_provider);
    let seat = crate::subagent::Seat::root(ctx.clone());
    let agent = AgentRun {
        store: &ctx.store,
        lease,
        run,
        sandbox,
        provider: ctx.providers.get(kind),
        model: run.model.name.clone().unwrap_or_else(|| ctx.config.default_model.clone()),
        max_tokens: run.model.max_tokens.unwrap_or(ctx.config.default_max_tokens),
        pricing: &|model, usage| ctx.prices.cost(model, usage),
        tools: &tools.tools,
        events,
        control,
        notice: tools.notice,
        system: String::new(),
        agents_md: None,
        compaction: crate::agent::compaction::Policy {
            context_window: run.model.context_window.unwrap_or(ctx.config.context_window),
            threshold: ctx.config.compaction_threshold,
        },
        max_tool_calls_per_step: ctx.config.max_tool_calls_per_step,
        prompt_cache: ctx.config.prompt_cache,
        role: None,
        read_only: false,
        seat: Some(&seat),
    };
    agent.drive().await
}
