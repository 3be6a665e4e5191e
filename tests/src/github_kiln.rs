//! Kiln wired to the fake GitHub ([`crate::fake_github`]): a worker's GitHub
//! side pointed at it, the webhook payload fixtures, and a webhook sent as
//! GitHub sends one.

use std::time::Duration;

use kiln_api::github::WebhookSecret;
use kiln_worker::github::{Credentials, DeliveryPolicy, Github, GithubSettings, RetryPolicy};
use serde_json::Value;
use uuid::Uuid;

use crate::TestApp;
use crate::fake_github::FakeGithub;

/// How often a worker of [`github_against`] looks for owed deliveries.
pub const OWED_POLL: Duration = Duration::from_millis(200);

/// A worker's GitHub side against `fake`, which serves git where it serves
/// the API, with `credentials`; links in reports point at `app`. Requests
/// are retried quickly and owed deliveries looked for every 200 ms.
pub fn github_against(fake: &FakeGithub, credentials: Credentials, app: &TestApp) -> Github {
    Github::new(GithubSettings {
        api_url: fake.url.clone(),
        web_url: fake.url.clone(),
        credentials,
        public_url: Some(format!("http://{}", app.addr)),
        retry: RetryPolicy { attempts: 4, base_delay: Duration::from_millis(50), max_delay: Duration::from_secs(2) },
        request_poll: OWED_POLL,
        policy: DeliveryPolicy::default(),
    })
    .unwrap()
}

/// The webhook payload `tests/fixtures/github/{name}`.
pub fn fixture(name: &str) -> Value {
    let path = format!("{}/fixtures/github/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).unwrap()
}

/// Sends `payload` to `app`'s webhook as a new delivery of `event`, signed
/// with `secret`.
pub async fn send_webhook(app: &TestApp, secret: &str, event: &str, payload: &Value) -> reqwest::Response {
    let body = serde_json::to_vec(payload).unwrap();
    let signature = WebhookSecret::new(secret.as_bytes()).unwrap().sign(&body);
    app.http
        .post(app.url("/v1/webhooks/github"))
        .header("content-type", "application/json")
        .header("x-github-event", event)
        .header("x-github-delivery", Uuid::new_v4().to_string())
        .header("x-hub-signature-256", signature)
        .body(body)
        .send()
        .await
        .unwrap()
}
