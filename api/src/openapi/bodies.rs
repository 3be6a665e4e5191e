//! Bodies the document names that no handler returns as one Rust type
//! (placeholders refined later, and answers built as JSON): a leaf the
//! routes' `#[utoipa::path]` attributes and the document both use.

/// One Server-Sent Event of `GET /v1/runs/{id}/events`, as its fields.
/// (Placeholder: [`super::events`] replaces it with one schema per kind.)
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct SseEvent {
    id: String,
    event: String,
    data: String,
}

/// `GET /healthz` and `GET /readyz`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct Health {
    /// `ok` (healthz) or `ready` (readyz).
    status: String,
}

/// `POST /v1/runs/{id}/deliver`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct DeliveryRequested {
    #[schema(pattern = "^requested$")]
    delivery: String,
}

/// `POST /v1/runs/{id}/approvals/{call_id}`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct Decided {
    call_id: String,
    approved: bool,
}

/// A GitHub delivery queued a run.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct WebhookRun {
    run_id: uuid::Uuid,
}

/// A GitHub delivery was recorded and ignored.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct WebhookIgnored {
    /// Why, e.g. `the event is not one Kiln acts on`.
    ignored: String,
}

/// A ping (`{"ok": true}`), a delivery seen before
/// (`{"duplicate": true, "run_id": …}`, the run it created or null), or a
/// `/kiln select K` comment that chose attempt K (`{"selected": K,
/// "run_id": …}`, the group).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum WebhookAnswered {
    Ping { ok: bool },
    Duplicate { duplicate: bool, run_id: Option<uuid::Uuid> },
    Selected { selected: u32, run_id: uuid::Uuid },
}
