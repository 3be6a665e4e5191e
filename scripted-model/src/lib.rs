//! A model server that replays a script.
//!
//! It is the stand-in for a model in Kiln's tests and the model of
//! `kiln up --demo`. It speaks the real streaming wire formats of the
//! Anthropic Messages API (`POST /v1/messages`), OpenAI Chat Completions
//! (`POST /v1/chat/completions`) and the OpenAI Responses API
//! (`POST /v1/responses`), byte-compatible with what those APIs send, so the
//! production provider code runs unchanged against it.
//!
//! Each request, on any endpoint, takes the next [`Reply`] of the
//! script (or of a thread's own script, when its first user message names
//! the thread: [`ScriptedModel::script_thread`], for sub-agents); once the script is used up every request gets a short final
//! answer ([`EXHAUSTED_TEXT`]) so runs still end. With
//! [`ScriptedModel::replay_per_conversation`] (what `kiln up` serves) every
//! conversation is instead played the script from its first reply, and one
//! that outlasts it gets an error that says so. Every request is recorded
//! for tests to inspect.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use kiln_scripted_model::{Reply, ScriptedModel};
//! let model = ScriptedModel::start(vec![
//!     Reply::tool("bash", serde_json::json!({"command": "ls"})),
//!     Reply::text("Done."),
//! ])
//! .await?;
//! let base_url = model.openai_base_url(); // point the provider here
//! # Ok(()) }
//! ```

mod anthropic;
mod conversation;
mod openai;
mod plan;
mod prompt_cache;
mod responses;
mod script;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use plan::Plan;
pub use prompt_cache::{CacheUsage, LOOKBACK, MIN_CACHEABLE_TOKENS, PromptCache};
pub use script::{EXHAUSTED_TEXT, Reply, ScriptedCall, demo_script};

/// Request headers worth asserting on; others are not recorded.
const RECORDED_HEADERS: &[&str] = &["authorization", "x-api-key", "anthropic-version", "content-type", "accept"];
/// Conversations grow; the default 2 MB body limit would cut long test runs.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// A running scripted model server. Dropping it stops the server, including
/// answers still streaming (a hanging answer ends, truncated).
pub struct ScriptedModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Set to `true` to stop: ends the accept loop and every open stream.
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

/// One request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// `/v1/messages`, `/v1/chat/completions` or `/v1/responses`.
    pub path: String,
    /// The parsed JSON body.
    pub body: Value,
    /// The body exactly as received (for byte-for-byte comparisons).
    pub bytes: Bytes,
    /// Selected headers, lower-case names: authorization, x-api-key,
    /// anthropic-version, content-type, accept.
    pub headers: BTreeMap<String, String>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

/// [`ScriptedModel::wait_for_requests`] gave up.
#[derive(Debug, thiserror::Error)]
#[error("expected {expected} model requests within {timeout:?}, got {received}")]
pub struct WaitTimeout {
    pub expected: usize,
    pub received: usize,
    pub timeout: Duration,
}

/// State the handlers share.
struct Shared {
    script: Vec<Reply>,
    /// Requests in arrival order.
    requests: Mutex<Vec<RecordedRequest>>,
    /// Replies handed out so far: the script position. Separate from the
    /// request count because a rejected request takes no reply.
    replies: Mutex<usize>,
    /// Number of tool calls handed out, for `call_N`/`toolu_N` ids.
    calls: Mutex<u64>,
    /// Count of recorded requests, for waiters.
    received: watch::Sender<usize>,
    /// With [`ScriptedModel::simulate_prompt_cache`]: the Anthropic
    /// endpoint's cache, which sets its usage instead of the script.
    prompt_cache: Mutex<Option<PromptCache>>,
    /// Conversations with scripts of their own, by a marker in their first
    /// user message.
    threads: Mutex<Vec<Thread>>,
    /// Replies the threads handed out, for their sequence numbers.
    thread_replies: Mutex<usize>,
    /// With [`ScriptedModel::replay_per_conversation`]: a request's reply
    /// is chosen by its conversation's length, not by arrival order.
    per_conversation: AtomicBool,
    shutdown: watch::Receiver<bool>,
}

/// Sequence numbers of thread replies start above this (the main script's
/// are its positions).
const THREAD_SEQS: usize = 1_000_000;

/// A conversation's own script.
struct Thread {
    marker: String,
    /// The marker is the request's model name (exactly), not text of its
    /// first user message.
    by_model: bool,
    script: Vec<Reply>,
    /// Replies handed out so far.
    replies: usize,
}

#[derive(Debug, Clone, Copy)]
enum Api {
    Anthropic,
    OpenAi,
    Responses,
}

impl ScriptedModel {
    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), script).await
    }

    /// Starts a server on `addr` (the demo binds an address its sandbox
    /// containers can reach).
    pub async fn start_on(addr: SocketAddr, script: Vec<Reply>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            script,
            requests: Mutex::new(Vec::new()),
            replies: Mutex::new(0),
            calls: Mutex::new(0),
            received: watch::channel(0).0,
            prompt_cache: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
            thread_replies: Mutex::new(0),
            per_conversation: AtomicBool::new(false),
            shutdown: shutdown_rx.clone(),
        });
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/responses", post(responses_endpoint))
            .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
            .with_state(shared.clone());
        let mut stop = shutdown_rx;
        let server = tokio::spawn(async move {
            // Without `TCP_NODELAY` a reply's small SSE frames wait for the
            // client's delayed ACK (~40 ms a model call on loopback), time
            // no real provider's stream spends and every benchmark through
            // this server counted in its model calls.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(err) = serve.await {
                tracing::warn!(%err, "scripted model server failed");
            }
        });
        tracing::debug!(%addr, "scripted model listening");
        Ok(ScriptedModel { addr, shared, shutdown, server: Some(server) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL for an OpenAI-compatible provider (Chat Completions or
    /// Responses): `http://127.0.0.1:PORT/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Base URL for the Anthropic provider: `http://127.0.0.1:PORT`.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on the Anthropic endpoint reports the cache reads and
    /// writes Anthropic's prompt cache would ([`PromptCache`]), computed
    /// from the requests' `cache_control` breakpoints; the script's
    /// [`Reply::with_cached_input`] numbers are then ignored there.
    pub fn simulate_prompt_cache(&self) {
        lock(&self.shared.prompt_cache).get_or_insert_with(PromptCache::default);
    }

    /// From now on every conversation is played the script from its first
    /// reply: a request gets the script's reply at the number of model
    /// turns its conversation already holds, so each run (each session)
    /// replays the same script however many ran before it, as a
    /// deterministic replay should. A conversation that asks for more
    /// replies than the script has gets an HTTP 400 whose message says the
    /// script is exhausted, so its run fails saying so instead of ending
    /// with an empty success. `kiln up` serves its demo model this way.
    pub fn replay_per_conversation(&self) {
        self.shared.per_conversation.store(true, Ordering::Relaxed);
    }

    /// Requests whose first user message contains `marker` take their
    /// replies from `script` (then the exhausted answer), not from the main
    /// script: a sub-agent's conversation starts with its prompt, so each
    /// child can be scripted apart from its parent and its siblings. The
    /// first thread whose marker matches wins.
    pub fn script_thread(&self, marker: impl Into<String>, script: Vec<Reply>) {
        lock(&self.shared.threads).push(Thread { marker: marker.into(), by_model: false, script, replies: 0 });
    }

    /// Requests naming the model `model` take their replies from `script`
    /// (then the exhausted answer): runs of one prompt on different models
    /// (a group's attempts, `attempt_models`) each get their own answers.
    pub fn script_model(&self, model: impl Into<String>, script: Vec<Reply>) {
        lock(&self.shared.threads).push(Thread { marker: model.into(), by_model: true, script, replies: 0 });
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Waits until at least `n` requests have arrived, then returns all of
    /// them.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Result<Vec<RecordedRequest>, WaitTimeout> {
        let mut received = self.shared.received.subscribe();
        let arrived = tokio::time::timeout(timeout, received.wait_for(|count| *count >= n)).await;
        match arrived {
            Ok(Ok(_)) => Ok(self.requests()),
            _ => Err(WaitTimeout { expected: n, received: self.requests().len(), timeout }),
        }
    }

    /// Stops the server and waits (briefly) for it to wind down.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A poisoned lock only means a handler panicked mid-push; the data is
/// still a list of requests.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn messages(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Api::Anthropic, "/v1/messages", &headers, &body)
}

async fn chat_completions(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Api::OpenAi, "/v1/chat/completions", &headers, &body)
}

async fn responses_endpoint(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Api::Responses, "/v1/responses", &headers, &body)
}

fn answer(shared: &Shared, api: Api, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    // A body that is not JSON is refused like the real APIs do, and not
    // recorded: there is nothing to assert on.
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return error_response(api, 400);
    };
    let streaming = json.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = json.pointer("/stream_options/include_usage").and_then(Value::as_bool) == Some(true);
    let model = json.get("model").and_then(Value::as_str).unwrap_or("scripted").to_owned();
    let first_user = first_user_message(&json);
    // Counted before the body is recorded (moved): the reply depends on it.
    let turn = shared.per_conversation.load(Ordering::Relaxed).then(|| conversation::model_turns(&json));
    let cache_usage = match api {
        Api::Anthropic => lock(&shared.prompt_cache).as_mut().map(|cache| cache.account(&json)),
        Api::OpenAi | Api::Responses => None,
    };
    shared.record(RecordedRequest {
        path: path.to_owned(),
        body: json,
        bytes: Bytes::copy_from_slice(body),
        headers: recorded_headers(headers),
    });
    // Kiln only ever streams; a non-streaming request is a bug to surface.
    if !streaming {
        return error_response(api, 400);
    }
    let Some((seq, reply)) = shared.next_reply(first_user.as_deref(), &model, turn) else {
        return exhausted_response(api, shared.script.len());
    };
    tracing::debug!(seq, ?api, ?reply, "scripted model answering");
    if let Some(status) = reply.status {
        return error_response(api, status);
    }
    if let Some(raw) = reply.raw {
        return event_stream(vec![raw], false, reply.delay, shared.shutdown.clone());
    }
    let mut plan = Plan::new(seq, model, &reply, body.len(), shared.take_call_numbers(reply.tool_calls.len()));
    if let Some(usage) = cache_usage {
        plan.input_tokens = usage.input_tokens;
        plan.cached_tokens = usage.cache_read_tokens;
        plan.cache_write_tokens = usage.cache_write_tokens;
    }
    let frames = match (api, plan.hang) {
        (Api::Anthropic, false) => anthropic::render(&plan),
        (Api::Anthropic, true) => anthropic::render_hang(&plan),
        (Api::OpenAi, false) => openai::render(&plan, include_usage),
        (Api::OpenAi, true) => openai::render_hang(&plan),
        (Api::Responses, false) => responses::render(&plan),
        (Api::Responses, true) => responses::render_hang(&plan),
    };
    let frames = if reply.cut { cut_mid_first_call(frames, &plan) } else { frames };
    event_stream(frames, plan.hang, reply.delay, shared.shutdown.clone())
}

impl Shared {
    fn record(&self, request: RecordedRequest) {
        let count = {
            let mut requests = lock(&self.requests);
            requests.push(request);
            requests.len()
        };
        self.received.send_replace(count);
    }

    /// The next reply of the script (or the exhausted answer) and its
    /// 1-based sequence number. `turn`: in per-conversation replay, the
    /// number of model turns the conversation already holds; `None` there
    /// once the script is used up. A thread (by its first user message, or
    /// by `model`) answers from its own script.
    fn next_reply(&self, first_user: Option<&str>, model: &str, turn: Option<usize>) -> Option<(usize, Reply)> {
        {
            let mut threads = lock(&self.threads);
            let matches = |t: &Thread| match (t.by_model, first_user) {
                (true, _) => t.marker == model,
                (false, Some(text)) => text.contains(&t.marker),
                (false, None) => false,
            };
            if let Some(thread) = threads.iter_mut().find(|t| matches(t)) {
                let reply = thread.script.get(thread.replies).cloned().unwrap_or_else(script::exhausted);
                thread.replies += 1;
                // Message ids stay unique without moving the main script
                // on: threads number their replies from THREAD_SEQS up.
                let mut served = lock(&self.thread_replies);
                *served += 1;
                return Some((THREAD_SEQS + *served, reply));
            }
        }
        let mut replies = lock(&self.replies);
        let reply = match turn {
            // The sequence number still counts every reply, so message ids
            // stay unique across conversations.
            Some(turn) => self.script.get(turn).cloned()?,
            None => self.script.get(*replies).cloned().unwrap_or_else(script::exhausted),
        };
        *replies += 1;
        Some((*replies, reply))
    }

    /// Reserves `n` call numbers; returns the first.
    fn take_call_numbers(&self, n: usize) -> u64 {
        let mut calls = lock(&self.calls);
        let first = *calls + 1;
        *calls += n as u64;
        first
    }
}

fn recorded_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    RECORDED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect()
}

/// Keeps the frames up to the first argument piece of the first tool call
/// (the frame naming the call, then one more), dropping everything after:
/// the rest of the arguments and every finish event.
fn cut_mid_first_call(mut frames: Vec<String>, plan: &Plan) -> Vec<String> {
    let Some(call) = plan.calls.first() else { return frames };
    let named = format!("\"name\":{}", Value::String(call.name.clone()));
    if let Some(i) = frames.iter().position(|f| f.contains(&named)) {
        frames.truncate(i + 2);
    }
    frames
}

/// Streams `frames` one per chunk; a hanging answer then stays open until
/// the client goes away or the server stops.
fn event_stream(
    frames: Vec<String>,
    hang: bool,
    delay: Option<Duration>,
    mut shutdown: watch::Receiver<bool>,
) -> Response {
    let wait = futures::stream::once(tokio::time::sleep(delay.unwrap_or_default())).filter_map(|()| async { None });
    let frames = wait
        .chain(futures::stream::iter(frames.into_iter().map(|f| Ok::<_, std::convert::Infallible>(Bytes::from(f)))));
    let forever = futures::stream::pending();
    let body = if hang { frames.chain(forever).boxed() } else { frames.boxed() };
    let body = body.take_until(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(body),
    )
        .into_response()
}

/// The text of the conversation's first user message (any of the three
/// wire formats), as JSON text: what [`ScriptedModel::script_thread`]
/// markers are looked for in.
fn first_user_message(json: &Value) -> Option<String> {
    let list = json.get("messages").or_else(|| json.get("input"))?.as_array()?;
    let first = list.iter().find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    Some(first.get("content").map_or_else(String::new, Value::to_string))
}

/// A per-conversation replay asked for more than its script: a request
/// error (not retryable) whose message the run's failure quotes.
fn exhausted_response(api: Api, script_len: usize) -> Response {
    let message =
        format!("{EXHAUSTED_TEXT}: this conversation has had all {script_len} replies of the scripted model's script");
    let mut body = match api {
        Api::Anthropic => anthropic::error_body(400),
        Api::OpenAi | Api::Responses => openai::error_body(400),
    };
    if let Some(slot) = body.pointer_mut("/error/message") {
        *slot = Value::String(message);
    }
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

fn error_response(api: Api, status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match api {
        Api::Anthropic => anthropic::error_body(status.as_u16()),
        // Both OpenAI APIs answer errors in the same shape.
        Api::OpenAi | Api::Responses => openai::error_body(status.as_u16()),
    };
    (status, axum::Json(body)).into_response()
}
