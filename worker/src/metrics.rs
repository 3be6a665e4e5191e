//! What the worker counts, recorded through the `metrics` facade: every
//! call is a no-op unless the binary installed a recorder (`kiln up`, or
//! `kiln worker` with `KILN_METRICS_LISTEN`). Names and labels are the
//! ones README's "Operating Kiln" lists; keep the two in step.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use kiln_protocol::{Run, Usage};

/// Distinct `model` label values one process records; later names are
/// counted as `other`. A run names its model, so without a cap any client
/// could add series to `/metrics` without end.
const MAX_MODEL_LABELS: usize = 64;

static MODEL_LABELS: LazyLock<LabelCap> = LazyLock::new(|| LabelCap::new(MAX_MODEL_LABELS));

fn model_label(model: &str) -> String {
    MODEL_LABELS.label(model)
}

/// Label values admitted so far, at most `max` of them.
struct LabelCap {
    max: usize,
    seen: Mutex<HashSet<String>>,
}

impl LabelCap {
    fn new(max: usize) -> Self {
        LabelCap { max, seen: Mutex::default() }
    }

    /// `value` itself while fewer than `max` values have been seen (or it
    /// is one of them), else `other`.
    fn label(&self, value: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(value) || seen.len() < self.max {
            seen.insert(value.to_owned());
            return value.to_owned();
        }
        "other".to_owned()
    }
}

/// A run was claimed. Claim latency (queued → claimed) counts first
/// attempts only: a retried run's age says how long ago it was submitted,
/// not how long it waited this time.
pub fn run_claimed(run: &Run, attempt: i32) {
    metrics::counter!("kiln_runs_claimed_total").increment(1);
    if attempt == 1 {
        let waited = (chrono::Utc::now() - run.created_at).to_std().unwrap_or_default();
        metrics::histogram!("kiln_claim_latency_seconds").record(waited.as_secs_f64());
    }
}

/// A run this worker drove ended with `status` (a run status name).
pub fn run_finished(status: &'static str) {
    metrics::counter!("kiln_runs_finished_total", "status" => status).increment(1);
}

/// One agent step (model call plus its tool calls) took `took`.
pub fn step_finished(took: Duration) {
    metrics::counter!("kiln_steps_total").increment(1);
    metrics::histogram!("kiln_step_duration_seconds").record(took.as_secs_f64());
}

/// One model call (retries included) ended with `outcome` (`ok` or `error`).
pub fn model_call(provider: &'static str, model: &str, outcome: &'static str, took: Duration, usage: Option<&Usage>) {
    let model = model_label(model);
    metrics::histogram!(
        "kiln_model_call_duration_seconds",
        "provider" => provider, "model" => model.clone(), "outcome" => outcome
    )
    .record(took.as_secs_f64());
    let Some(usage) = usage else { return };
    for (kind, n) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("cache_write", usage.cache_write_tokens),
    ] {
        metrics::counter!("kiln_model_tokens_total", "provider" => provider, "model" => model.clone(), "kind" => kind)
            .increment(n);
    }
}

/// One tool call ended. `tool` must be a registered tool's name (or
/// `unknown`): the model can make up names, and labels must stay few.
pub fn tool_call(tool: String, outcome: &'static str, took: Duration) {
    metrics::counter!("kiln_tool_calls_total", "tool" => tool.clone(), "outcome" => outcome).increment(1);
    metrics::histogram!("kiln_tool_call_duration_seconds", "tool" => tool, "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// Warm containers ready now.
pub fn warm_pool_size(n: usize) {
    metrics::gauge!("kiln_warm_pool_size").set(n as f64);
}

/// Counts a sandbox in use by a run while it lives; dropping it (however
/// the run ends) gives the count back.
pub struct ActiveSandbox(());

impl ActiveSandbox {
    pub fn enter() -> Self {
        metrics::gauge!("kiln_sandboxes_active").increment(1.0);
        ActiveSandbox(())
    }
}

impl Drop for ActiveSandbox {
    fn drop(&mut self) {
        metrics::gauge!("kiln_sandboxes_active").decrement(1.0);
    }
}

/// The egress proxy refused a connection or request; `layer`: whose rule
/// (`deployment`, `run`, or `proxy` for its own checks).
pub fn egress_denied(layer: &'static str) {
    metrics::counter!("kiln_egress_denied_total", "layer" => layer).increment(1);
}

/// The egress proxy let a connection or request through.
pub fn egress_allowed() {
    metrics::counter!("kiln_egress_allowed_total").increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_stop_growing_after_the_cap() {
        let cap = LabelCap::new(MAX_MODEL_LABELS);
        let names: Vec<String> = (0..MAX_MODEL_LABELS).map(|i| format!("model-{i}")).collect();
        for name in &names {
            assert_eq!(cap.label(name), *name);
        }
        assert_eq!(cap.label("one-too-many"), "other");
        assert_eq!(cap.label("and-another"), "other");
        assert_eq!(cap.label(&names[3]), names[3], "names seen before keep their label");
    }
}
