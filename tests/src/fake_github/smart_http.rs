//! git's smart HTTP protocol, served by `git http-backend` as a CGI program:
//! the request becomes its environment and stdin, its stdout becomes the
//! response (CGI headers, a blank line, then the body, streamed).

use std::path::Path;
use std::process::Stdio;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio_util::io::ReaderStream;

/// Runs `git http-backend` for one request against the repositories under
/// `root`, as `remote_user`.
pub async fn serve(
    root: &Path,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
    remote_user: &str,
) -> Response {
    let mut cmd = Command::new("git");
    cmd.arg("http-backend")
        // Only what CGI says, plus what git needs to find itself: the
        // test process's own git settings have no say.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or(""))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", remote_user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Headers as CGI passes them. `Content-Encoding: gzip` (git compresses
    // larger fetch negotiations) arrives as HTTP_CONTENT_ENCODING, which
    // http-backend inflates itself; `Git-Protocol` as HTTP_GIT_PROTOCOL
    // selects protocol v2. Credentials are never passed to CGI programs.
    for (name, value) in headers {
        let Ok(value) = value.to_str() else { continue };
        match name.as_str() {
            "content-type" => {
                cmd.env("CONTENT_TYPE", value);
            }
            "authorization" | "content-length" => {}
            other => {
                cmd.env(format!("HTTP_{}", other.to_uppercase().replace('-', "_")), value);
            }
        }
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("starting git http-backend: {e}")).into_response();
        }
    };
    let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "git http-backend has no pipes").into_response();
    };
    // Fed while the answer is read, so a large body cannot deadlock the two.
    tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let what = format!("{method} {uri}");
    tokio::spawn(async move {
        let mut errors = String::new();
        let _ = stderr.read_to_string(&mut errors).await;
        let status = child.wait().await;
        if !errors.trim().is_empty() || !status.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("fake GitHub: git http-backend for {what}: {status:?}: {}", errors.trim());
        }
    });

    let mut stdout = BufReader::new(stdout);
    let mut response = Response::builder();
    let mut status = StatusCode::OK;
    loop {
        let mut line = String::new();
        match stdout.read_line(&mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return (StatusCode::BAD_GATEWAY, format!("reading git http-backend: {e}")).into_response(),
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return (StatusCode::BAD_GATEWAY, format!("git http-backend sent a bad header line: {line:?}"))
                .into_response();
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            // `Status: 404 Not Found`
            status = value
                .get(..3)
                .and_then(|c| StatusCode::from_bytes(c.as_bytes()).ok())
                .unwrap_or(StatusCode::BAD_GATEWAY);
        } else {
            response = response.header(name, value);
        }
    }
    response
        .status(status)
        .body(Body::from_stream(ReaderStream::new(stdout)))
        .unwrap_or_else(|e| (StatusCode::BAD_GATEWAY, format!("git http-backend's answer: {e}")).into_response())
}
