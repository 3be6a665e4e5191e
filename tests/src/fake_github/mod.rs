//! A fake GitHub: the REST endpoints Kiln's worker calls, and real bare
//! repositories served over git's smart HTTP protocol by `git http-backend`
//! at `/<owner>/<name>.git`, as on github.com. It records every request, and
//! like GitHub it wants a token for git: HTTP basic auth with user
//! `x-access-token` and a token it knows (one it minted for an App
//! installation, or one the test registered).

mod repo;
mod smart_http;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use bytes::Bytes;
use serde_json::{Value, json};

pub use repo::{BareRepo, git};

/// One request the fake GitHub received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The `Authorization` header, verbatim.
    pub auth: Option<String>,
    /// The JSON body (`Null` for git's and other non-JSON bodies).
    pub body: Value,
    /// A git smart-HTTP request rather than a REST call.
    pub git: bool,
    /// The request's `Content-Encoding` (git gzips larger negotiations).
    pub encoding: Option<String>,
}

#[derive(Default)]
struct FakeState {
    seen: Vec<Seen>,
    /// Every REST call answers 503 (git is served apart, as on GitHub).
    api_down: bool,
    /// Requests to this path answer 502 this many times first.
    flaky: Option<(String, usize)>,
    next_id: i64,
    /// Tokens git may authenticate with.
    git_tokens: Vec<String>,
    /// Users' roles on every repository (`read`, `triage`, `write`,
    /// `maintain`, `admin`); anyone not listed is an admin.
    roles: Vec<(String, String)>,
}

#[derive(Clone)]
pub struct FakeGithub {
    /// `http://127.0.0.1:<port>`: the REST API base and the git host.
    pub url: String,
    state: Arc<Mutex<FakeState>>,
}

#[derive(Clone)]
struct AppState {
    state: Arc<Mutex<FakeState>>,
    git_root: PathBuf,
}

impl FakeGithub {
    /// Serves the REST API, and the repositories under `git_root` (laid out
    /// `owner/name.git`) over smart HTTP.
    pub async fn start(git_root: PathBuf) -> FakeGithub {
        let state = Arc::new(Mutex::new(FakeState { next_id: 1000, ..Default::default() }));
        let app = Router::new().fallback(handle).with_state(AppState { state: state.clone(), git_root });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeGithub { url, state }
    }

    /// Where git clones `full_name` (`owner/name`) from.
    pub fn clone_url(&self, full_name: &str) -> String {
        format!("{}/{full_name}.git", self.url)
    }

    /// Lets git in with `token`.
    pub fn accept_git_token(&self, token: &str) {
        self.state.lock().unwrap().git_tokens.push(token.to_owned());
    }

    /// Every request so far, REST and git.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// REST calls so far.
    pub fn api_seen(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| !s.git).collect()
    }

    /// git requests so far.
    pub fn git_seen(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.git).collect()
    }

    pub fn seen_to(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == method && s.path == path).collect()
    }

    /// Every REST call answers 503 while `down`; git still works, as when
    /// GitHub's API has an outage.
    pub fn set_api_down(&self, down: bool) {
        self.state.lock().unwrap().api_down = down;
    }

    /// `login`'s role on every repository, as GitHub's collaborator
    /// permission endpoint reports it.
    pub fn set_role(&self, login: &str, role: &str) {
        self.state.lock().unwrap().roles.push((login.to_owned(), role.to_owned()));
    }

    /// The next `times` requests to `path` answer 502.
    pub fn set_flaky(&self, path: &str, times: usize) {
        self.state.lock().unwrap().flaky = Some((path.to_owned(), times));
    }
}

/// The basic-auth header git sends for `token`.
pub fn git_basic_auth(token: &str) -> String {
    format!("Basic {}", BASE64_STANDARD.encode(format!("x-access-token:{token}")))
}

/// `/<owner>/<name>.git/…`: a git request.
fn is_git_path(path: &str) -> bool {
    let mut parts = path.trim_start_matches('/').split('/');
    matches!((parts.next(), parts.next()), (Some(o), Some(n)) if !o.is_empty() && n.len() > 4 && n.ends_with(".git"))
}

async fn handle(State(app): State<AppState>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let git = is_git_path(&path);
    let auth = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
    {
        let mut s = app.state.lock().unwrap();
        s.seen.push(Seen {
            method: method.to_string(),
            path: path.clone(),
            auth: auth.clone(),
            body: if git { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) },
            git,
            encoding: headers.get("content-encoding").map(|v| v.to_str().unwrap().to_owned()),
        });
        if s.api_down && !git {
            return (StatusCode::SERVICE_UNAVAILABLE, "GitHub is down").into_response();
        }
        if let Some((p, n)) = &mut s.flaky
            && *p == path
            && *n > 0
        {
            *n -= 1;
            return (StatusCode::BAD_GATEWAY, "bad gateway").into_response();
        }
    }
    if !git {
        return rest(&app.state, &method, &path);
    }
    let known = app.state.lock().unwrap().git_tokens.iter().any(|t| auth.as_deref() == Some(&git_basic_auth(t)));
    if !known {
        // What GitHub answers; git (with prompts off) then gives up.
        return (StatusCode::UNAUTHORIZED, [("www-authenticate", "Basic realm=\"GitHub\"")], "token required")
            .into_response();
    }
    smart_http::serve(&app.git_root, &method, &uri, &headers, body, "x-access-token").await
}

/// The REST endpoints delivery calls.
fn rest(state: &Mutex<FakeState>, method: &Method, path: &str) -> Response {
    let mut s = state.lock().unwrap();
    s.next_id += 1;
    let id = s.next_id;
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let created = |v: Value| (StatusCode::CREATED, axum::Json(v)).into_response();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["repos", o, r, "issues", n]) => {
            axum::Json(json!({ "number": n.parse::<i64>().unwrap(), "title": format!("Fix the greeting in {o}/{r}") }))
                .into_response()
        }
        ("GET", ["repos", o, r, "pulls", _]) => {
            axum::Json(json!({ "head": { "ref": "feature", "repo": { "full_name": format!("{o}/{r}") } } }))
                .into_response()
        }
        ("POST", ["repos", _, _, "issues", "comments", _, "reactions"]) => {
            created(json!({ "id": id, "content": "eyes" }))
        }
        ("POST", ["repos", o, r, "issues", n, "comments"]) => created(
            json!({ "id": id, "html_url": format!("https://github.test/{o}/{r}/issues/{n}#issuecomment-{id}") }),
        ),
        ("POST", ["app", "installations", n, "access_tokens"]) => {
            let token = format!("ghs_secretinstallation{n}");
            s.git_tokens.push(token.clone());
            let expires_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
            created(json!({ "token": token, "expires_at": expires_at }))
        }
        ("GET", ["repos", _, _, "collaborators", user, "permission"]) => {
            let role = s.roles.iter().rev().find(|(u, _)| u == user).map_or("admin", |(_, r)| r.as_str());
            // `permission` folds roles into GitHub's older four levels.
            let permission = match role {
                "maintain" => "write",
                "triage" => "read",
                other => other,
            };
            axum::Json(json!({ "permission": permission, "role_name": role, "user": { "login": user } }))
                .into_response()
        }
        ("POST", ["repos", o, r, "pulls"]) => {
            created(json!({ "number": 77, "html_url": format!("https://github.test/{o}/{r}/pull/77") }))
        }
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not Found" }))).into_response(),
    }
}
