//! `/v1/environments`: a subject's environments (create, list, get,
//! replace, delete, reset the cache). Another subject's environment is a
//! 404, as a run is. Secrets are sealed here, before the store sees them,
//! and never answered.

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use kiln_protocol::environment::EnvironmentError;
use kiln_protocol::{Environment, EnvironmentSpec, input};
use kiln_store::{EnvironmentRefusal, MAX_ENVIRONMENTS_PER_OWNER, McpServersWrite, SecretsWrite};
use serde::Serialize;

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

/// Checks `spec` and seals its secrets with the deployment's key.
fn checked(state: &AppState, owner: &str, spec: &EnvironmentSpec) -> Result<SecretsWrite, ApiError> {
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
    let Some(secrets) = &spec.secrets else { return Ok(SecretsWrite::Keep) };
    if secrets.is_empty() {
        return Ok(SecretsWrite::Set { names: Vec::new(), sealed: None });
    }
    // Refused rather than kept in clear: without a key there is nothing to
    // seal them with.
    let key = state.settings.secrets_key.as_ref().ok_or_else(|| {
        ApiError::Validation(
            "secrets cannot be stored here: this deployment has no KILN_SECRETS_KEY to encrypt them with".into(),
        )
    })?;
    let sealed = key.seal(owner, secrets).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(SecretsWrite::Set { names: secrets.keys().cloned().collect(), sealed: Some(sealed) })
}

/// The MCP servers of `spec` as stored, their headers sealed. A remote
/// server without `headers` keeps what `stored` (the environment before
/// this write, on `PUT`) holds for a remote server of the same name.
fn mcp_servers(
    state: &AppState,
    owner: &str,
    spec: &EnvironmentSpec,
    stored: Option<&kiln_store::StoredEnvironment>,
) -> Result<McpServersWrite, ApiError> {
    let mut write = McpServersWrite::default();
    for (name, server) in &spec.mcp_servers {
        let mut header_names = Vec::new();
        match &server.headers {
            Some(headers) if server.is_remote() && !headers.is_empty() => {
                // As secrets: refused rather than kept in clear.
                let key = state.settings.secrets_key.as_ref().ok_or_else(|| {
                    ApiError::Validation(format!(
                        "mcp_servers: the headers of server {name:?} cannot be stored here: this deployment has no \
                         KILN_SECRETS_KEY to encrypt them with"
                    ))
                })?;
                let sealed =
                    key.seal_mcp_headers(owner, name, headers).map_err(|e| ApiError::Internal(e.to_string()))?;
                write.headers_sealed.insert(name.clone(), sealed);
                header_names = headers.keys().cloned().collect();
            }
            Some(_) => {}
            None if server.is_remote() => {
                let kept = stored.and_then(|s| {
                    let view = s.environment.mcp_servers.get(name).filter(|v| v.url.is_some())?;
                    Some((view.header_names.clone(), s.mcp_headers_sealed.get(name)?.clone()))
                });
                if let Some((names, sealed)) = kept {
                    write.headers_sealed.insert(name.clone(), sealed);
                    header_names = names;
                }
            }
            None => {}
        }
        write.servers.insert(name.clone(), server.view(header_names));
    }
    Ok(write)
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
    let secrets = checked(&state, &owner, &spec)?;
    let mcp = mcp_servers(&state, &owner, &spec, None)?;
    match state.store.create_environment(&owner, &spec, secrets, &mcp).await? {
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
/// stored for a remote server of its name. A changed definition misses the
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
    let secrets = checked(&state, &owner, &spec)?;
    // The stored headers a server without `headers` keeps. Read before the
    // write, not in it: two concurrent PUTs of one environment end as one
    // of them whole, as they do for everything else.
    let stored = state.store.environment(&owner, &name).await?.ok_or_else(not_found)?;
    let mcp = mcp_servers(&state, &owner, &spec, Some(&stored))?;
    match state.store.update_environment(&owner, &name, &spec, secrets, &mcp).await? {
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
