//! Logs, traces and the metrics recorder of the `kiln` binary.
//!
//! - Logs: text, or one JSON object per line with `KILN_LOG_FORMAT=json`;
//!   JSON lines carry the current span and the list of spans they are in,
//!   so a line logged while working on a run names its `run_id`,
//!   `session_id` and `step`.
//! - Traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the same spans go out over
//!   OTLP/HTTP (protobuf).
//! - Metrics: one Prometheus recorder per process, installed on first use,
//!   which the API's `/metrics` and the worker's metrics listener render.

mod latest_fields;

use latest_fields::LatestFields;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

/// Histogram buckets (seconds) for every `*_seconds` metric: from a fast
/// tool call (5 ms) to a long model answer or a queue wait (10 min).
const BUCKETS: &[f64] = &[0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// How often histograms are drained when nobody scrapes (bounds memory).
const UPKEEP: Duration = Duration::from_secs(5);

/// What must be flushed before the process exits.
#[derive(Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still buffered. The SDK's shutdown blocks, so it runs
    /// off the async threads (the export itself runs on them).
    pub async fn shutdown(self) {
        if let Some(provider) = self.tracer
            && let Ok(Err(e)) = tokio::task::spawn_blocking(move || provider.shutdown()).await
        {
            eprintln!("kiln: flushing traces failed: {e}");
        }
    }
}

/// Where spans go: the OTLP/HTTP traces URL from the standard variables
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` plus `/v1/traces`), or `None` for no traces.
pub fn traces_endpoint_from_env() -> Option<String> {
    let set = |value: Result<String, std::env::VarError>| value.ok().filter(|v| !v.trim().is_empty());
    set(std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).or_else(|| {
        set(std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    })
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (`KILN_LOG_FORMAT=json`).
    Json,
    /// Text; coloured only for a person at a terminal, so a log written to
    /// a file or a pipe holds no escape codes.
    Text { colour: bool },
}

impl LogFormat {
    /// From `KILN_LOG_FORMAT`, colouring text only when stderr is a terminal.
    pub fn from_env() -> LogFormat {
        use std::io::IsTerminal;
        if std::env::var("KILN_LOG_FORMAT").is_ok_and(|f| f == "json") {
            LogFormat::Json
        } else {
            LogFormat::Text { colour: std::io::stderr().is_terminal() }
        }
    }
}

/// The subscriber `kiln` logs and traces with: `filter` for both, lines in
/// `format` to `writer`, and spans to `traces` (an OTLP/HTTP traces
/// URL) when given. Must be called inside the Tokio runtime (the span
/// exporter runs on it).
pub fn subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    writer: W,
    traces: Option<&str>,
) -> anyhow::Result<(impl tracing::Subscriber + Send + Sync + 'static, Telemetry)>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = match format {
        // The span list is what puts the run's ids on every line of the run.
        LogFormat::Json => fmt.json().with_current_span(true).with_span_list(true).boxed(),
        // A span field recorded again (the run's `step`) is shown once.
        LogFormat::Text { colour } => fmt.with_ansi(colour).fmt_fields(LatestFields::default()).boxed(),
    };
    let tracer = traces.map(tracer_provider).transpose()?;
    let otel = tracer.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("kiln")));
    let subscriber = tracing_subscriber::registry().with(filter).with(fmt).with(otel);
    Ok((subscriber, Telemetry { tracer }))
}

fn tracer_provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    // The exporter builds a reqwest client, which (built without a default
    // TLS backend) needs a process-wide crypto provider; `main` installs
    // the same one, so whichever comes first wins.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("building the OTLP exporter for {endpoint}"))?;
    // The async-runtime processor exports with the workspace's async reqwest
    // on Tokio (the default processor's own thread has no Tokio reactor).
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "kiln".into());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

/// The recorder's flush handle, kept for [`shutdown`].
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);

/// Installs the process's subscriber from the environment (`RUST_LOG`,
/// `KILN_LOG_FORMAT`, `OTEL_EXPORTER_OTLP_*`), logging to stderr. A trace
/// exporter that cannot be built is reported and left out: logs still work.
pub fn init(default_filter: &str) {
    let filter = || log_filter(default_filter);
    let format = LogFormat::from_env();
    let traces = traces_endpoint_from_env();
    let built = match subscriber(filter(), format, std::io::stderr, traces.as_deref()) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("kiln: traces are off: {e:#}");
            match subscriber(filter(), format, std::io::stderr, None) {
                Ok(built) => built,
                Err(e) => return eprintln!("kiln: logging is off: {e:#}"),
            }
        }
    };
    let (subscriber, telemetry) = built;
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        *TELEMETRY.lock().unwrap_or_else(|p| p.into_inner()) = Some(telemetry);
    }
}

/// The Docker client's lines that are never logged, whatever `RUST_LOG`
/// says: at `debug` and below bollard prints every request's body, and an
/// exec's body holds its environment, which for an environment's setup
/// script holds the environment's secrets.
const DOCKER_CLIENT_CAP: &str = "bollard=info";

/// `RUST_LOG`, or `default_filter` without it, with bollard capped at
/// [`DOCKER_CLIENT_CAP`].
pub fn log_filter(default_filter: &str) -> EnvFilter {
    capped(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)))
}

fn capped(filter: EnvFilter) -> EnvFilter {
    match DOCKER_CLIENT_CAP.parse() {
        Ok(cap) => filter.add_directive(cap),
        Err(_) => filter,
    }
}

/// Flushes what [`init`] set up; call before the process exits.
pub async fn shutdown() {
    let telemetry = TELEMETRY.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
}

/// The process's Prometheus recorder, installed on first use. The API and
/// an in-process worker (`kiln up`) record into the same one, so the API's
/// `/metrics` shows both.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let builder = match builder.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "histogram buckets refused; exporting summaries");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics shows only what reaches this one");
            }
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let upkeep = handle.clone();
                rt.spawn(async move {
                    let mut tick = tokio::time::interval(UPKEEP);
                    loop {
                        tick.tick().await;
                        upkeep.run_upkeep();
                    }
                });
            }
            handle
        })
        .clone()
}

/// Serves `GET /metrics` from this process's recorder on `listen` (a
/// worker's own listener; the API serves `/metrics` itself) until
/// `shutdown` fires. Returns the bound address.
pub async fn serve_metrics(listen: SocketAddr, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let handle = prometheus();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = handle.render();
            async move { ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the metrics listener {listen}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The Docker client's request bodies stay out of the logs even when
    /// the operator asks for everything, bollard's lines included.
    #[test]
    fn the_docker_clients_request_bodies_are_never_logged() {
        for asked in ["trace", "bollard=trace", "trace,bollard=trace"] {
            let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
            let writer = lines.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(capped(EnvFilter::new(asked)))
                .with_writer(move || WriterOf(writer.clone()))
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                tracing::debug!(target: "bollard::docker", "Env: TOKEN=s3cret");
                tracing::info!(target: "bollard::docker", "bollard info");
                tracing::trace!(target: "kiln_worker::x", "kiln trace");
            });
            let text = String::from_utf8_lossy(&lines.lock().unwrap()).into_owned();
            assert!(!text.contains("s3cret") && text.contains("bollard info"), "{asked}: {text}");
            assert_eq!(text.contains("kiln trace"), asked.starts_with("trace"), "{asked}: {text}");
        }
    }

    struct WriterOf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for WriterOf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
