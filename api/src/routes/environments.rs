//! `/v1/environments`: a subject's environments (create, list, get,
//! replace, delete, reset the cache). Another subject's environment is a
//! 404, as a run is. Secrets are sealed here, before the store sees them,
//! and never answered.

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use kiln_protocol::environment::EnvironmentError;
use kiln_protocol::mcp::McpServerSpec;
use kiln_protocol::{Environment, EnvironmentSpec, input};
use kiln_store::secrets::{Sealed, SecretsKey};
use kiln_store::{EnvironmentRefusal, MAX_ENVIRONMENTS_PER_OWNER, McpServersWrite, SecretsWrite, StoredEnvironment};
use serde::Serialize;
use uuid::Uuid;

use crate::auth::Subject;
use crate::extract::ApiJson;
use crate::{ApiError, AppState};

/// The `{name}` path segment as an environment's name.
pub struct NamePath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for NamePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(raw) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(e.body_text()))?;
        if !input::ENVIRONMENT_NAME.accepts(&raw) {
            return Err(ApiError::BadRequest(
                "an environment's name is lower-case letters, digits, '.', '_' and '-'".into(),
            ));
        }
        Ok(NamePath(raw))
    }
}

fn not_found() -> ApiError {
    ApiError::NotFound("no environment with this name".into())
}

fn refused(refusal: EnvironmentRefusal, name: &str) -> ApiError {
    match refusal {
        EnvironmentRefusal::NotFound => not_found(),
        EnvironmentRefusal::NameTaken => ApiError::Conflict(format!("you already have an environment named {name:?}")),
        EnvironmentRefusal::TooMany => ApiError::Conflict(format!(
            "you have {MAX_ENVIRONMENTS_PER_OWNER} environments, the most allowed; delete one first"
        )),
    }
}

/// Checks `spec`: 422, or 409 for parts that contradict each other.
fn validated(state: &AppState, spec: &EnvironmentSpec) -> Result<(), ApiError> {
    spec.validate().map_err(|e| match e {
        // Two parts of the request that contradict each other, which no
        // schema of either part can state: 409, like other conflicts.
        EnvironmentError::BothVariableAndSecret(_) => ApiError::Conflict(e.to_string()),
        e => ApiError::Validation(e.to_string()),
    })?;
    // Only names the operator allows: never an image id or id prefix, nor
    // a prepared environment (another tenant's files).
    if let Some(image) = &spec.image {
        state.settings.environment_images.check(image).map_err(|e| ApiError::Validation(e.to_string()))?;
    }
    Ok(())
}

/// The deployment's key, or a 422 saying `what` cannot be stored without
/// one (refused rather than kept in clear).
fn sealing_key(state: &AppState, what: impl FnOnce() -> String) -> Result<&SecretsKey, ApiError> {
    state.settings.secrets_key.as_deref().ok_or_else(|| {
        ApiError::Validation(format!(
            "{} cannot be stored here: this deployment has no KILN_SECRETS_KEY to encrypt them with",
            what()
        ))
    })
}

/// What the secrets of environment `id` become: `spec`'s, sealed for it,
/// or (without `secrets`) what `stored` holds.
fn secrets_write(
    state: &AppState,
    owner: &str,
    id: Uuid,
    spec: &EnvironmentSpec,
    stored: Option<&StoredEnvironment>,
) -> Result<SecretsWrite, ApiError> {
    let Some(secrets) = &spec.secrets else { return Ok(kept_secrets(state, owner, id, stored)) };
    if secrets.is_empty() {
        return Ok(SecretsWrite::Set { names: Vec::new(), sealed: None });
    }
    let key = sealing_key(state, || "secrets".to_owned())?;
    let sealed = key.seal(&Sealed::secrets(owner, id), secrets).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(SecretsWrite::Set { names: secrets.keys().cloned().collect(), sealed: Some(sealed) })
}

/// The stored secrets, kept: as they are, unless they were sealed the old
/// way (before the binding named the environment), when they are sealed
/// again for it (see `kiln_store::secrets`). Ones that do not open are
/// kept as they are: the worker says so when a run needs them.
fn kept_secrets(state: &AppState, owner: &str, id: Uuid, stored: Option<&StoredEnvironment>) -> SecretsWrite {
    let (Some(key), Some(stored)) = (state.settings.secrets_key.as_deref(), stored) else {
        return SecretsWrite::Keep;
    };
    let Some(sealed) = &stored.secrets_sealed else { return SecretsWrite::Keep };
    match key.reseal_if_old(&Sealed::secrets(owner, id), sealed) {
        Ok(Some(resealed)) => {
            SecretsWrite::Set { names: stored.environment.secret_names.clone(), sealed: Some(resealed) }
        }
        Ok(None) | Err(_) => SecretsWrite::Keep,
    }
}

/// The MCP servers of `spec` as stored for environment `id`, their headers
/// sealed. A remote server without `headers` keeps what `stored` (the
/// environment before this write, on `PUT`) holds for it, see
/// [`kept_headers`].
fn mcp_servers(
    state: &AppState,
    owner: &str,
    id: Uuid,
    spec: &EnvironmentSpec,
    stored: Option<&StoredEnvironment>,
) -> Result<McpServersWrite, ApiError> {
    let mut write = McpServersWrite::default();
    for (name, server) in &spec.mcp_servers {
        let at = Sealed::mcp_headers(owner, id, name);
        let headers = match &server.headers {
            Some(headers) if server.is_remote() && !headers.is_empty() => {
                let key = sealing_key(state, || format!("mcp_servers: the headers of server {name:?}"))?;
                let sealed = key.seal(&at, headers).map_err(|e| ApiError::Internal(e.to_string()))?;
                Some((headers.keys().cloned().collect(), sealed))
            }
            Some(_) => None,
            None => kept_headers(state, &at, name, server, stored),
        };
        let header_names = match headers {
            Some((names, sealed)) => {
                write.headers_sealed.insert(name.clone(), sealed);
                names
            }
            None => Vec::new(),
        };
        write.servers.insert(name.clone(), server.view(header_names));
    }
    Ok(write)
}

/// The stored headers (names and sealed values) that server `name`, sent
/// without `headers`, keeps: those of the stored server of that name if it
/// was remote at the very same `url`. Headers are credentials for the host
/// they were given for: a changed `url` (or a server that was of the other
/// kind) keeps none, or whoever holds the tenant's token could send the
/// stored `Authorization` to a host of their choosing. Sealed again when
/// they were sealed the old way.
fn kept_headers(
    state: &AppState,
    at: &Sealed<'_>,
    name: &str,
    server: &McpServerSpec,
    stored: Option<&StoredEnvironment>,
) -> Option<(Vec<String>, Vec<u8>)> {
    let url = server.url.as_ref()?;
    let stored = stored?;
    let view = stored.environment.mcp_servers.get(name).filter(|v| v.url.as_ref() == Some(url))?;
    let sealed = stored.mcp_headers_sealed.get(name)?;
    let resealed = state.settings.secrets_key.as_deref().and_then(|key| key.reseal_if_old(at, sealed).ok().flatten());
    Some((view.header_names.clone(), resealed.unwrap_or_else(|| sealed.clone())))
}

/// Create an environment
///
/// Secrets and MCP servers' header values are write-only: stored
/// encrypted, answered by name only. MCP servers defined here are never
/// trusted for their tools' `readOnlyHint` (that trust is the operator's).
#[utoipa::path(
    post,
    path = "/v1/environments",
    operation_id = "create_environment",
    tag = "environments",
    request_body = EnvironmentSpec,
    responses(
        (status = 201, description = "The environment was created.", body = Environment),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 422, response = crate::openapi::errors::Unprocessable),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Subject(owner): Subject,
    ApiJson(spec): ApiJson<EnvironmentSpec>,
) -> Result<(StatusCode, Json<Environment>), ApiError> {
    validated(&state, &spec)?;
    // The id is chosen here: the sealed values are bound to it.
    let id = Uuid::now_v7();
    let secrets = secrets_write(&state, &owner, id, &spec, None)?;
    let mcp = mcp_servers(&state, &owner, id, &spec, None)?;
    match state.store.create_environment(id, &owner, &spec, secrets, &mcp).await? {
        Ok(environment) => Ok((StatusCode::CREATED, Json(environment))),
        Err(refusal) => Err(refused(refusal, &spec.name)),
    }
}

/// The caller's environments.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EnvironmentList {
    environments: Vec<Environment>,
}

/// List environments
///
/// The caller's environments, by name.
#[utoipa::path(
    get,
    path = "/v1/environments",
    operation_id = "list_environments",
    tag = "environments",
    responses(
        (status = 200, description = "The caller's environments.", body = EnvironmentList),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn list(State(state): State<AppState>, Subject(owner): Subject) -> Result<Json<EnvironmentList>, ApiError> {
    Ok(Json(EnvironmentList { environments: state.store.list_environments(&owner).await? }))
}

/// Get an environment
#[utoipa::path(
    get,
    path = "/v1/environments/{name}",
    operation_id = "get_environment",
    tag = "environments",
    params(("name" = String, Path, description = "The environment's name.")),
    responses(
        (status = 200, description = "The environment (secret names only).", body = Environment),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Subject(owner): Subject,
    NamePath(name): NamePath,
) -> Result<Json<Environment>, ApiError> {
    let stored = state.store.environment(&owner, &name).await?.ok_or_else(not_found)?;
    Ok(Json(stored.environment))
}

/// Replace an environment
///
/// The body replaces the environment whole (its `name` may rename it),
/// except that leaving out `secrets` keeps the stored ones (`{}` removes
/// them), and a remote MCP server without `headers` keeps the headers
/// stored for a remote server of its name at the same `url` (a changed
/// `url` drops them: send them again). A changed definition misses the
/// cache on the next run; changed `mcp_servers` do not.
#[utoipa::path(
    put,
    path = "/v1/environments/{name}",
    operation_id = "update_environment",
    tag = "environments",
    params(("name" = String, Path, description = "The environment's name.")),
    request_body = EnvironmentSpec,
    responses(
        (status = 200, description = "The environment as it now is.", body = Environment),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 422, response = crate::openapi::errors::Unprocessable),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn update(
    State(state): State<AppState>,
    Subject(owner): Subject,
    NamePath(name): NamePath,
    ApiJson(spec): ApiJson<EnvironmentSpec>,
) -> Result<Json<Environment>, ApiError> {
    validated(&state, &spec)?;
    // The stored headers a server without `headers` keeps, and the id the
    // values are sealed for. Read before the write, not in it: two
    // concurrent PUTs of one environment end as one of them whole, as they
    // do for everything else (and one deleted and made again meanwhile is
    // a 404: the write names the id).
    let stored = state.store.environment(&owner, &name).await?.ok_or_else(not_found)?;
    let id = stored.environment.id;
    let secrets = secrets_write(&state, &owner, id, &spec, Some(&stored))?;
    let mcp = mcp_servers(&state, &owner, id, &spec, Some(&stored))?;
    match state.store.update_environment(id, &owner, &name, &spec, secrets, &mcp).await? {
        Ok(environment) => Ok(Json(environment)),
        Err(refusal) => Err(refused(refusal, &spec.name)),
    }
}

/// Delete an environment
///
/// Runs already queued with it fail when they start.
#[utoipa::path(
    delete,
    path = "/v1/environments/{name}",
    operation_id = "delete_environment",
    tag = "environments",
    params(("name" = String, Path, description = "The environment's name.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    Subject(owner): Subject,
    NamePath(name): NamePath,
) -> Result<StatusCode, ApiError> {
    if state.store.delete_environment(&owner, &name).await? { Ok(StatusCode::NO_CONTENT) } else { Err(not_found()) }
}

/// Reset an environment's cache
///
/// Every prepared sandbox of this environment misses from now on: the
/// next run sets up afresh. (The old images age out of the workers' caches.)
#[utoipa::path(
    post,
    path = "/v1/environments/{name}/reset-cache",
    operation_id = "reset_environment_cache",
    tag = "environments",
    params(("name" = String, Path, description = "The environment's name.")),
    responses(
        (status = 200, description = "The environment, with its new `cache_generation`.", body = Environment),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn reset_cache(
    State(state): State<AppState>,
    Subject(owner): Subject,
    NamePath(name): NamePath,
) -> Result<Json<Environment>, ApiError> {
    let environment = state.store.reset_environment_cache(&owner, &name).await?.ok_or_else(not_found)?;
    Ok(Json(environment))
}
