//! A client of a running Kiln: submit, list, cancel and approve runs, and
//! read their events (a page at a time, or following the SSE stream).

use std::time::Duration;

use anyhow::{Context, bail};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_protocol::changes::{ChangeScope, RunChanges};
use kiln_protocol::event::is_terminal_kind;
use kiln_protocol::{CreateRun, EventBody, Run, RunStatus};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::base_url::{self, BaseUrl};

/// Reconnection attempts in a row, without an event in between, before
/// following gives up.
const MAX_RECONNECTS: u32 = 10;
/// A stream open this long before it ended was working (the server ended
/// it): reconnecting after it is not a failure.
const STREAM_WORKED: Duration = Duration::from_secs(5);
/// Events per page when reading a run's events as JSON (the API's largest).
const PAGE: u32 = 1000;

/// One event exactly as the API streamed it: what `--json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamedEvent {
    pub seq: i64,
    pub kind: String,
    pub payload: Value,
}

impl StreamedEvent {
    /// The typed event, or `None` for a kind newer than this client.
    pub fn body(&self) -> Option<EventBody> {
        serde_json::from_value(json!({ "kind": self.kind, "payload": self.payload })).ok()
    }

    pub fn is_terminal(&self) -> bool {
        is_terminal_kind(&self.kind)
    }
}

/// How a decided approval went, for `kiln approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Deny,
}

/// What `POST /v1/runs/{id}/cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The run was queued and is now cancelled.
    Now,
    /// The run is working; its worker stops it and writes `run.cancelled`.
    Requested,
}

#[derive(Deserialize)]
struct RunList {
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct EventPage {
    events: Vec<StreamedEvent>,
    next_after: i64,
}

pub struct KilnClient {
    base: BaseUrl,
    token: SecretString,
    http: reqwest::Client,
}

impl KilnClient {
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        let base = BaseUrl::parse(base)?;
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        Ok(KilnClient { base, token: token.into(), http })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        request
            .bearer_auth(self.token.expose_secret())
            .send()
            .await
            .map_err(|e| anyhow::anyhow!(base_url::unreachable(&self.base, &e)))
    }

    pub async fn create_run(&self, spec: &CreateRun) -> anyhow::Result<Run> {
        parse(self.send(self.http.post(self.url("/v1/runs")).json(spec)).await?).await
    }

    pub async fn get_run(&self, id: Uuid) -> anyhow::Result<Run> {
        parse(self.send(self.http.get(self.url(&format!("/v1/runs/{id}")))).await?).await
    }

    /// The newest runs first, at most `limit` (the API allows 1 to 200).
    pub async fn list_runs(&self, status: Option<RunStatus>, limit: u32) -> anyhow::Result<Vec<Run>> {
        // Numbers and status words need no escaping in a query string.
        let mut path = format!("/v1/runs?limit={limit}");
        if let Some(status) = status {
            path.push_str(&format!("&status={status}"));
        }
        let list: RunList = parse(self.send(self.http.get(self.url(&path))).await?).await?;
        Ok(list.runs)
    }

    /// The run's change, summarised (`GET /v1/runs/{id}/changes`).
    pub async fn changes(&self, id: Uuid, scope: ChangeScope) -> anyhow::Result<RunChanges> {
        let path = format!("/v1/runs/{id}/changes?scope={}", scope_word(scope));
        parse(self.send(self.http.get(self.url(&path))).await?).await
    }

    /// The run's patch, exactly the bytes the API keeps (`GET
    /// /v1/runs/{id}/patch`): what `git apply` takes.
    pub async fn patch(&self, id: Uuid, scope: ChangeScope) -> anyhow::Result<Vec<u8>> {
        let path = format!("/v1/runs/{id}/patch?scope={}", scope_word(scope));
        let response = self.send(self.http.get(self.url(&path))).await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("Kiln answered HTTP {status}: {}", error_message(&body));
        }
        Ok(response.bytes().await?.to_vec())
    }

    /// Makes attempt `attempt` of group `id` its result (`POST /v1/runs/{id}/select`).
    pub async fn select_attempt(&self, id: Uuid, attempt: u32) -> anyhow::Result<Run> {
        let body = kiln_protocol::SelectAttempt { attempt };
        parse(self.send(self.http.post(self.url(&format!("/v1/runs/{id}/select"))).json(&body)).await?).await
    }

    pub async fn cancel_run(&self, id: Uuid) -> anyhow::Result<(Cancelled, Run)> {
        let response = self.send(self.http.post(self.url(&format!("/v1/runs/{id}/cancel")))).await?;
        let how =
            if response.status() == reqwest::StatusCode::ACCEPTED { Cancelled::Requested } else { Cancelled::Now };
        Ok((how, parse(response).await?))
    }

    pub async fn decide(
        &self,
        id: Uuid,
        call_id: &str,
        decision: Decision,
        reason: Option<&str>,
    ) -> anyhow::Result<()> {
        let decision = match decision {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        };
        let mut body = json!({ "decision": decision });
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        // Call ids are the model's; keep whatever they hold inside one path segment.
        let mut url = reqwest::Url::parse(&self.url(&format!("/v1/runs/{id}/approvals/")))
            .with_context(|| format!("KILN_URL {:?} is not a URL", self.base))?;
        url.path_segments_mut().map_err(|()| anyhow::anyhow!("KILN_URL cannot be a base URL"))?.pop().push(call_id);
        parse::<Value>(self.send(self.http.post(url).json(&body)).await?).await?;
        Ok(())
    }

    /// The run's events after `after` as they are now, one page of the
    /// JSON form of the events route at a time (this includes what comes
    /// after the terminal event, such as GitHub deliveries).
    pub async fn events(
        &self,
        id: Uuid,
        mut after: i64,
        mut on_event: impl FnMut(&StreamedEvent),
    ) -> anyhow::Result<()> {
        loop {
            let request = self
                .http
                .get(self.url(&format!("/v1/runs/{id}/events?after={after}&limit={PAGE}")))
                .header("accept", "application/json");
            let page: EventPage = parse(self.send(request).await?).await?;
            if page.events.is_empty() {
                return Ok(());
            }
            for event in &page.events {
                on_event(event);
            }
            after = page.next_after;
        }
    }

    /// Follows the run's events after `after` until its terminal event,
    /// reconnecting with `Last-Event-ID` when the connection drops, and
    /// returns that event's kind. `on_event` sees each event exactly once,
    /// in order.
    pub async fn follow(
        &self,
        id: Uuid,
        after: i64,
        mut on_event: impl FnMut(&StreamedEvent),
    ) -> anyhow::Result<String> {
        let mut last_seq = after;
        let mut failures = 0u32;
        loop {
            let response = match self.open_events(id, last_seq, &mut failures).await? {
                Opened::Stream(response) => response,
                Opened::Ended(kind) => return Ok(kind),
                Opened::Retry => continue,
            };
            let opened = std::time::Instant::now();
            let stream = response.bytes_stream().eventsource();
            if let Some(kind) = read_events(stream, id, &mut last_seq, &mut failures, &mut on_event).await? {
                return Ok(kind);
            }
            // The stream ended without a terminal event (the API instance
            // stopped, the network dropped it, it reached `KILN_SSE_MAX_S`):
            // resume where it left off. Only streams that end at once count
            // as failures: a quiet run's stream may end many times.
            if opened.elapsed() >= STREAM_WORKED {
                failures = 0;
            }
            failures += 1;
            if failures > MAX_RECONNECTS {
                bail!("following run {id}: the event stream kept ending without the run's end");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One request for the run's event stream after `last_seq`: the stream,
    /// the run's end when it was seen already, or a retry after a pause
    /// (an unreachable or unavailable API) until there were too many.
    async fn open_events(&self, id: Uuid, last_seq: i64, failures: &mut u32) -> anyhow::Result<Opened> {
        let response = self
            .http
            .get(self.url(&format!("/v1/runs/{id}/events")))
            .bearer_auth(self.token.expose_secret())
            .header("accept", "text/event-stream")
            .header("last-event-id", last_seq.to_string())
            .send()
            .await;
        match response {
            // The run ended and its terminal event was seen already.
            Ok(r) if r.status() == reqwest::StatusCode::NO_CONTENT => {
                Ok(Opened::Ended(format!("run.{}", self.get_run(id).await?.status.as_str())))
            }
            Ok(r) if r.status().is_success() => Ok(Opened::Stream(r)),
            // The API is there and says no (unknown run, bad token): retrying will not help.
            Ok(r) if r.status().is_client_error() => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                bail!("following run {id} failed: HTTP {status}: {}", error_message(&body));
            }
            // Unreachable, or unavailable for now (a 5xx while the database restarts).
            other => {
                *failures += 1;
                if *failures > MAX_RECONNECTS {
                    return match other {
                        Err(e) => Err(anyhow::anyhow!("following run {id}: {}", base_url::unreachable(&self.base, &e))),
                        Ok(r) => bail!("following run {id} failed: HTTP {}", r.status()),
                    };
                }
                tokio::time::sleep(Duration::from_millis(500 * u64::from(*failures))).await;
                Ok(Opened::Retry)
            }
        }
    }
}

/// What one request for a run's event stream gave.
enum Opened {
    Stream(reqwest::Response),
    /// The run had ended: its terminal event's kind.
    Ended(String),
    Retry,
}

/// Hands each new event of an open stream to `on_event` (those at or
/// before `last_seq` were seen already) until the run's terminal event,
/// whose kind it returns; `None` when the stream ends or breaks first.
async fn read_events<S, E>(
    mut stream: S,
    id: Uuid,
    last_seq: &mut i64,
    failures: &mut u32,
    on_event: &mut impl FnMut(&StreamedEvent),
) -> anyhow::Result<Option<String>>
where
    S: futures::Stream<Item = Result<eventsource_stream::Event, E>> + Unpin,
{
    while let Some(item) = stream.next().await {
        // A broken stream: the caller reconnects and resumes after the last event seen.
        let Ok(event) = item else { break };
        // Keep-alive comments and anything else without an id carry no event.
        let Ok(seq) = event.id.parse::<i64>() else { continue };
        if seq <= *last_seq {
            continue;
        }
        *last_seq = seq;
        *failures = 0;
        let payload: Value = serde_json::from_str(&event.data)
            .with_context(|| format!("event {seq} of run {id} is not JSON: {}", event.data))?;
        let event = StreamedEvent { seq, kind: event.event, payload };
        on_event(&event);
        if event.is_terminal() {
            return Ok(Some(event.kind));
        }
    }
    Ok(None)
}

impl KilnClient {
    /// `method` on `/v1/` + `segments` (each kept inside one path segment,
    /// whatever it holds), with `body` as JSON; the answer's JSON (`null`
    /// for an empty answer such as `204`).
    pub async fn call(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut url =
            reqwest::Url::parse(&self.url("/v1/")).with_context(|| format!("KILN_URL {:?} is not a URL", self.base))?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("KILN_URL cannot be a base URL"))?
            .pop_if_empty()
            .extend(segments);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = self.send(request).await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("Kiln answered HTTP {status}: {}", error_message(&text));
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("unexpected answer from Kiln: {text}"))
    }
}

async fn parse<T: serde::de::DeserializeOwned>(response: reqwest::Response) -> anyhow::Result<T> {
    let status = response.status();
    let body = response.text().await?;
    if !status.is_success() {
        bail!("Kiln answered HTTP {status}: {}", error_message(&body));
    }
    serde_json::from_str(&body).with_context(|| format!("unexpected answer from Kiln: {body}"))
}

/// `scope` as the API's query parameter spells it.
fn scope_word(scope: ChangeScope) -> &'static str {
    match scope {
        ChangeScope::Run => "run",
        ChangeScope::Session => "session",
    }
}

/// The API's `{"error": {"message"}}`, or the body as it is.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.to_owned())
}
