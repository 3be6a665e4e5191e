//! The OCI runtime sandboxes run under (`KILN_SANDBOX_RUNTIME`), checked
//! against the engine once at worker start: a runtime the engine does not
//! know would otherwise fail every run, each with Docker's terse "unknown
//! or invalid runtime name".

use bollard::Docker;

/// Why the configured runtime cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "KILN_SANDBOX_RUNTIME is {wanted:?}, but the Docker engine has no runtime of that name (it has: {known}); \
         register it in the engine's daemon.json (\"runtimes\") and reload the engine, or unset KILN_SANDBOX_RUNTIME"
    )]
    Unknown { wanted: String, known: String },
    #[error("asking the Docker engine which runtimes it has: {0}")]
    Docker(#[from] bollard::errors::Error),
}

/// `Ok` when `wanted` is `None` (the engine's default) or a runtime the
/// engine has registered.
pub async fn check(docker: &Docker, wanted: Option<&str>) -> Result<(), RuntimeError> {
    let Some(wanted) = wanted else { return Ok(()) };
    let info = docker.info().await?;
    let mut known: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    if known.iter().any(|k| k == wanted) {
        return Ok(());
    }
    known.sort();
    Err(RuntimeError::Unknown { wanted: wanted.to_owned(), known: known.join(", ") })
}
