//! One model call: stream it, emit its deltas as events, assemble the
//! assistant message, retry what a retry can fix.

use std::time::Duration;

use futures::StreamExt;
use kiln_protocol::EventBody;
use tracing::Instrument;

use super::AgentError;
use crate::event_sink::{COALESCE, EventSink};
use crate::providers::assemble::{Assembled, AssistantBuilder};
use crate::providers::{ModelEvent, ModelProvider, ModelRequest, ProviderError};
use crate::retry::Policy;

const BASE_DELAY: Duration = Duration::from_millis(500);
const MAX_DELAY: Duration = Duration::from_secs(30);
/// Four attempts per model call, the first included; a provider's
/// retry-after is honoured up to twice the longest backoff.
const RETRIES: Policy = Policy::attempts(4, BASE_DELAY, MAX_DELAY);

/// Calls the model, retrying retryable failures with exponential backoff and
/// jitter (honouring the provider's retry-after); each retry is an event.
/// The answer is agent step `step`'s: its calls get Kiln's ids from it.
pub async fn call_model(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    events: &mut EventSink,
    step: u32,
) -> Result<Assembled, AgentError> {
    call(provider, request, events, Some(step)).await
}

/// Like [`call_model`], but the answer is not streamed to clients (e.g. a
/// compaction summary, which is not the agent talking); retries still are.
pub async fn call_model_quietly(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    events: &mut EventSink,
) -> Result<Assembled, AgentError> {
    call(provider, request, events, None).await
}

/// One model call in its `model_call` span, timed and counted (retries
/// included: the time is what the run waited). `step`: the agent step the
/// answer is for, streamed to clients; `None`: not the agent talking.
async fn call(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    events: &mut EventSink,
    step: Option<u32>,
) -> Result<Assembled, AgentError> {
    let span = tracing::info_span!(
        "model_call",
        provider = provider.name(),
        model = %request.model,
        attempts = tracing::field::Empty,
        outcome = tracing::field::Empty,
        input_tokens = tracing::field::Empty,
        output_tokens = tracing::field::Empty,
        finish_reason = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let result = call_with_retries(provider, request, events, step).instrument(span.clone()).await;
    let usage = result.as_ref().ok().map(|a| &a.usage);
    let outcome = if result.is_ok() { "ok" } else { "error" };
    span.record("outcome", outcome);
    if let Ok(assembled) = &result {
        span.record("input_tokens", assembled.usage.input_tokens)
            .record("output_tokens", assembled.usage.output_tokens);
        if let Some(reason) = &assembled.finish_reason {
            span.record("finish_reason", reason.as_str());
        }
    }
    crate::metrics::model_call(provider.name(), &request.model, outcome, started.elapsed(), usage);
    result
}

async fn call_with_retries(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    events: &mut EventSink,
    step: Option<u32>,
) -> Result<Assembled, AgentError> {
    // Driven here rather than by `retry::retry`: the retry's event goes
    // through the same sink the attempt streams into.
    let mut schedule = RETRIES.schedule();
    loop {
        let attempt = schedule.attempt();
        tracing::Span::current().record("attempts", attempt);
        match stream_once(provider, request, events, step).await {
            Ok(assembled) => return Ok(assembled),
            Err(AgentError::Provider(e)) if e.is_retryable() => {
                let Some(delay) = schedule.next_delay(e.retry_after()) else { return Err(e.into()) };
                tracing::warn!(error = %e, attempt, ?delay, "model call failed; retrying");
                events
                    .write_now(EventBody::ModelRetry {
                        attempt,
                        delay_ms: delay.as_millis() as u64,
                        error: e.to_string(),
                    })
                    .await?;
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn stream_once(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    events: &mut EventSink,
    step: Option<u32>,
) -> Result<Assembled, AgentError> {
    // What the loop holds (the last step's tool message, its results and
    // this step's start) commits while the request goes out and the model
    // starts: the request does not wait on the WAL flush. A failed commit
    // (a lost lease) ends the call before its answer is read; the request
    // was sent, and what the provider bills for it is not recorded (the
    // run's new holder repeats the step).
    let (committed, stream) = events.commit_alongside(provider.stream(request)).await;
    committed?;
    let mut stream = stream?;
    let mut builder = step.map_or_else(AssistantBuilder::new, AssistantBuilder::for_step);
    let stream_deltas = step.is_some();
    let mut tick = tokio::time::interval(COALESCE);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = tick.tick() => {
                events.write_if_stale().await?;
                continue;
            }
        };
        let Some(item) = item else { break };
        let event = item?;
        builder.push(&event);
        if let (ModelEvent::Usage(_), Some(step)) = (&event, step) {
            events.note_usage_so_far(step, builder.usage());
        }
        if stream_deltas && let Some(body) = event_for(&builder, &event) {
            // Shown within the coalescing window; the rest waits for the
            // step's message, which is written right after the stream.
            events.write_soon(body).await?;
        }
        if matches!(event, ModelEvent::Finish(_)) {
            break;
        }
    }
    if builder.finish_reason().is_none() {
        return Err(ProviderError::Truncated.into());
    }
    if step.is_some() {
        events.step_answered();
    }
    Ok(builder.finish())
}

/// The client-facing event for a model event, if any.
fn event_for(builder: &AssistantBuilder, event: &ModelEvent) -> Option<EventBody> {
    match event {
        ModelEvent::TextDelta(text) if !text.is_empty() => Some(EventBody::TextDelta { text: text.clone() }),
        ModelEvent::ReasoningDelta(text) if !text.is_empty() => Some(EventBody::ReasoningDelta { text: text.clone() }),
        ModelEvent::ToolCallStart { index, .. } => Some(EventBody::ToolCallStarted {
            call_id: builder.call_id(*index)?.to_owned(),
            name: builder.call_name(*index)?.to_owned(),
        }),
        ModelEvent::ToolCallDelta { index, arguments } if !arguments.is_empty() => Some(EventBody::ToolCallDelta {
            call_id: builder.call_id(*index)?.to_owned(),
            arguments_delta: arguments.clone(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(attempt: u32, retry_after: Option<Duration>) -> Duration {
        RETRIES.backoff(attempt, retry_after).unwrap_or(Duration::MAX)
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        assert!(backoff(1, None) <= BASE_DELAY);
        assert!(backoff(1, None) >= BASE_DELAY / 2);
        assert!(backoff(3, None) <= BASE_DELAY * 4);
        assert!(backoff(30, None) <= MAX_DELAY);
        assert_eq!(backoff(1, Some(Duration::from_secs(7))), Duration::from_secs(7));
    }
}
