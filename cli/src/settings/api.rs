//! The HTTP API's own limits and timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use secrecy::SecretString;

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Address the API listens on.
    #[arg(long, env = "KILN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(long, env = "KILN_MAX_BODY_BYTES", default_value_t = kiln_api::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Runs one subject may have queued or running at once (429 beyond);
    /// `unlimited`: not counted.
    #[arg(long, env = "KILN_MAX_ACTIVE_RUNS_PER_SUBJECT", default_value = "20", value_parser = quota_limit)]
    pub max_active_runs_per_subject: i64,
    /// Runs one subject may create per minute (429 with Retry-After beyond);
    /// `unlimited`: not counted. With both unlimited a submission takes no
    /// per-subject lock.
    #[arg(long, env = "KILN_MAX_RUNS_PER_MINUTE", default_value = "60", value_parser = quota_limit)]
    pub max_runs_per_minute: i64,
    /// Event streams one subject may hold open on one API instance.
    #[arg(long, env = "KILN_MAX_SSE_PER_SUBJECT", default_value_t = 32)]
    pub max_sse_per_subject: usize,
    /// Seconds `/metrics` reuses its database read (runs by status, queue
    /// depth and age); one grouped count over the runs table per refresh.
    #[arg(long, env = "KILN_METRICS_REFRESH_S", default_value_t = 10)]
    pub metrics_refresh_s: u64,
    /// Bearer token `/metrics` on the API's listener asks for (Prometheus'
    /// `authorization` scrape setting). Unset: the API's listener serves no
    /// metrics (404); see KILN_API_METRICS_LISTEN.
    #[arg(long, env = "KILN_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<SecretString>,
    /// Address of a listener of the API's metrics' own, serving `GET
    /// /metrics` without a token and nothing else (e.g. 0.0.0.0:9090, kept
    /// off public networks). Unset: none.
    #[arg(long, env = "KILN_API_METRICS_LISTEN")]
    pub api_metrics_listen: Option<SocketAddr>,
    /// Seconds a request may take to arrive and be answered (408 beyond);
    /// for an event stream, until its headers.
    #[arg(long, env = "KILN_HTTP_REQUEST_TIMEOUT_S", default_value_t = 30)]
    pub http_request_timeout_s: u64,
    /// Seconds a client may take to send a request's headers (and an idle
    /// keep-alive connection may stay open).
    #[arg(long, env = "KILN_HTTP_HEADER_TIMEOUT_S", default_value_t = 30)]
    pub http_header_timeout_s: u64,
    /// Seconds a response may wait for a client that takes no bytes before
    /// its connection is closed (a stalled event stream resumes with
    /// `Last-Event-ID`).
    #[arg(long, env = "KILN_HTTP_WRITE_STALL_S", default_value_t = 120)]
    pub http_write_stall_s: u64,
    /// Seconds an event stream stays open; then it ends and the client
    /// resumes with `Last-Event-ID` (EventSource does so by itself).
    #[arg(long, env = "KILN_SSE_MAX_S", default_value_t = 1800)]
    pub sse_max_s: u64,
    /// Bytes of events one page (or one read of an event stream's catch-up)
    /// loads besides the count limit; at least one event always comes.
    #[arg(long, env = "KILN_EVENT_PAGE_BYTES", default_value_t = kiln_api::DEFAULT_EVENT_PAGE_BYTES)]
    pub event_page_bytes: usize,
    /// The most attempts one run may ask for (`"attempts": N`, each a run
    /// with its own sandbox), from 1 to 4.
    #[arg(long, env = "KILN_MAX_ATTEMPTS", default_value_t = kiln_protocol::input::ATTEMPTS.max)]
    pub max_attempts: u32,
}

/// A quota's limit: a number of runs, or `unlimited` (`Quota::UNLIMITED`).
fn quota_limit(value: &str) -> Result<i64, String> {
    if value.eq_ignore_ascii_case("unlimited") {
        return Ok(kiln_store::Quota::UNLIMITED);
    }
    value.parse::<i64>().map_err(|_| format!("{value:?} is neither a number of runs nor `unlimited`"))
}

impl ApiArgs {
    pub fn settings(&self) -> kiln_api::ApiSettings {
        kiln_api::ApiSettings {
            max_body_bytes: self.max_body_bytes,
            quota: kiln_store::Quota {
                max_active_runs: self.max_active_runs_per_subject.max(1),
                max_runs_per_minute: self.max_runs_per_minute.max(1),
            },
            max_sse_per_subject: self.max_sse_per_subject.max(1),
            metrics_refresh: Duration::from_secs(self.metrics_refresh_s),
            metrics_token: self.metrics_token.clone(),
            request_timeout: seconds(self.http_request_timeout_s),
            sse_max_duration: seconds(self.sse_max_s),
            event_page_bytes: self.event_page_bytes.max(1024),
            max_attempts: self.max_attempts.clamp(1, kiln_protocol::input::ATTEMPTS.max),
            connection: kiln_api::HttpTimeouts {
                header_read: seconds(self.http_header_timeout_s),
                write_stall: seconds(self.http_write_stall_s),
            },
            ..Default::default()
        }
    }
}

/// A limit in whole seconds; 0 would refuse everything, so it means 1.
fn seconds(s: u64) -> Duration {
    Duration::from_secs(s.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_limit_is_a_number_or_unlimited() {
        assert_eq!(quota_limit("20"), Ok(20));
        assert_eq!(quota_limit("unlimited"), Ok(kiln_store::Quota::UNLIMITED));
        assert_eq!(quota_limit("Unlimited"), Ok(kiln_store::Quota::UNLIMITED));
        assert!(quota_limit("lots").unwrap_err().contains("unlimited"));
        assert!(quota_limit("").is_err());
    }
}
