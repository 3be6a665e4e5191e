//! What a test's workers leave in Docker: the containers labelled with their
//! ids (sessions' sandboxes and warm ones) and the networks of the test's
//! sessions. A worker removes them itself when a run ends or it shuts down,
//! but a test ends without waiting for that, and a failing test ends
//! anywhere. The harness removes them when a [`crate::TestApp`] drops: only
//! its own, found by its workers' ids and its own database's sessions, never
//! another test's.
//!
//! Looking is only worth something once nothing can make more: the workers'
//! tasks run on a runtime of the app's own (see `TestApp::start_worker_on`),
//! which [`clean_up`] shuts down first. A request the engine had already been
//! sent (a warm container's create, say) can still land after that, so it
//! looks until two looks in a row, a moment apart, find nothing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions};
use kiln_worker::sandbox::{LABEL_SESSION, LABEL_WORKER};

/// Names of what a test's workers left behind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub containers: Vec<String>,
    pub networks: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.networks.is_empty()
    }
}

/// A Docker or database call that did not answer in time (or failed): a
/// look that cannot say "nothing is left".
#[derive(Debug)]
pub struct LookFailed {
    pub why: String,
    /// No answer within [`CALL_TIMEOUT`] (not an error): asking again
    /// would most likely wait as long.
    pub unanswered: bool,
}

/// How long one Docker or database call of the clean-up may take. A busy
/// engine answers a list or a forced removal well within it; a call that
/// takes longer must not hang the test (it would, in `Drop`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the workers' runtime may take to stop (its blocking tasks: a
/// workspace archive being written, a checkout's digest).
const STOP_WITHIN: Duration = Duration::from_secs(5);
/// Between two looks: time for a create the engine was sent before the
/// workers stopped to show up.
const AGAIN_AFTER: Duration = Duration::from_millis(500);
/// Looks in a row that must find nothing.
const CLEAN_LOOKS: usize = 2;
/// The most the looking takes, whatever the engine does.
const LOOK_FOR: Duration = Duration::from_secs(30);
/// The most [`clean_up`] blocks its caller: stopping, looking, and a margin.
/// Past it the caller goes on and the clean-up thread finishes alone.
const CLEAN_UP_WITHIN: Duration = Duration::from_secs(50);

async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, LookFailed> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(LookFailed { why: format!("{what}: {e}"), unanswered: false }),
        Err(_) => Err(LookFailed { why: format!("{what}: no answer within {CALL_TIMEOUT:?}"), unanswered: true }),
    }
}

/// The containers of `workers` (any state) and the networks of the sessions
/// in the database at `db_url`; every call bounded by [`CALL_TIMEOUT`].
pub async fn find(docker: &Docker, db_url: &str, workers: &[String]) -> Result<Leftovers, LookFailed> {
    let containers = containers(docker, workers).await?;
    let networks = networks(docker, db_url).await?;
    Ok(Leftovers { containers, networks })
}

async fn containers(docker: &Docker, workers: &[String]) -> Result<Vec<String>, LookFailed> {
    let mut containers = Vec::new();
    for worker in workers {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_WORKER}={worker}")])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        for c in bounded("listing containers", docker.list_containers(Some(options))).await? {
            let name = c.names.and_then(|n| n.into_iter().next()).map(|n| n.trim_start_matches('/').to_owned());
            containers.extend(name.or(c.id));
        }
    }
    Ok(containers)
}

async fn networks(docker: &Docker, db_url: &str) -> Result<Vec<String>, LookFailed> {
    let sessions = sessions(db_url).await?;
    let mut networks = Vec::new();
    if !sessions.is_empty() {
        let filters = HashMap::from([("label".to_owned(), vec![LABEL_SESSION.to_owned()])]);
        let options = ListNetworksOptions { filters: Some(filters) };
        for n in bounded("listing networks", docker.list_networks(Some(options))).await? {
            let session = n.labels.as_ref().and_then(|l| l.get(LABEL_SESSION));
            if session.is_some_and(|s| sessions.contains(s)) {
                networks.extend(n.name);
            }
        }
    }
    Ok(networks)
}

/// Removes `leftovers` (containers first: a network in use cannot go);
/// each call bounded by [`CALL_TIMEOUT`]. What failed is looked for again.
pub async fn remove(docker: &Docker, leftovers: &Leftovers) {
    for name in &leftovers.containers {
        // As the worker removes one: with its anonymous volumes (workspace,
        // home, toolbox; without them each removed sandbox left three
        // behind) and its loop disk, if it has one.
        let removing = async {
            kiln_worker::sandbox::remove_by_id(docker, name).await;
            Ok::<_, String>(())
        };
        let _ = bounded("removing a container", removing).await;
    }
    for name in &leftovers.networks {
        let _ = bounded("removing a network", docker.remove_network(name)).await;
    }
}

/// What [`clean_up`] did.
#[derive(Debug, Default)]
pub struct CleanUp {
    /// Everything it removed.
    pub removed: Leftovers,
    /// Why it could not show that nothing is left (`None`: two looks in a
    /// row found nothing).
    pub unfinished: Option<String>,
    /// Why the sessions' networks could not be looked for.
    networks_unknown: Option<String>,
}

/// Stops the workers' `runtime` (every task on it dropped), then finds and
/// removes what `workers` left until two looks in a row find nothing, all
/// from a thread of its own: a `Drop` cannot await, and the test's runtime
/// may be the one it runs on. Blocks at most [`CLEAN_UP_WITHIN`].
pub fn clean_up(runtime: Option<tokio::runtime::Runtime>, db_url: String, workers: Vec<String>) -> CleanUp {
    let (done, result) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("test-clean-up".into()).spawn(move || {
        if let Some(runtime) = runtime {
            runtime.shutdown_timeout(STOP_WITHIN);
        }
        let _ = done.send(look_and_remove(&db_url, &workers));
    });
    if let Err(e) = spawned {
        return CleanUp { unfinished: Some(format!("starting the clean-up thread: {e}")), ..Default::default() };
    }
    result.recv_timeout(CLEAN_UP_WITHIN).unwrap_or_else(|_| CleanUp {
        unfinished: Some(format!("the clean-up did not finish within {CLEAN_UP_WITHIN:?}")),
        ..Default::default()
    })
}

fn look_and_remove(db_url: &str, workers: &[String]) -> CleanUp {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            return CleanUp { unfinished: Some(format!("a runtime for the clean-up: {e}")), ..Default::default() };
        }
    };
    runtime.block_on(async {
        let docker = match Docker::connect_with_local_defaults() {
            Ok(docker) => docker,
            Err(e) => return CleanUp { unfinished: Some(format!("connecting to Docker: {e}")), ..Default::default() },
        };
        let mut done = CleanUp::default();
        let deadline = Instant::now() + LOOK_FOR;
        let mut clean_looks = 0;
        // Set once the sessions' networks cannot be looked for any more.
        let mut networks_given_up = false;
        loop {
            // A database that is gone (a test's own server, stopped first)
            // hides its sessions' networks, not the containers: those are
            // still removed, and the look still counts. One that refuses is
            // asked again at the next look (it costs nothing); one that did
            // not answer is not: each look would wait CALL_TIMEOUT on it.
            let found = match containers(&docker, workers).await {
                Ok(containers) if networks_given_up => Ok(Leftovers { containers, networks: Vec::new() }),
                Ok(containers) => match networks(&docker, db_url).await {
                    Ok(networks) => {
                        done.networks_unknown = None;
                        Ok(Leftovers { containers, networks })
                    }
                    Err(LookFailed { why, unanswered }) => {
                        networks_given_up = unanswered;
                        let again = if unanswered { "not asked again" } else { "asked again at each look" };
                        done.networks_unknown =
                            Some(format!("the sessions' networks were not looked for ({why}; {again})"));
                        Ok(Leftovers { containers, networks: Vec::new() })
                    }
                },
                Err(failed) => Err(failed),
            };
            match found {
                Ok(found) if found.is_empty() => {
                    clean_looks += 1;
                    done.unfinished = None;
                    if clean_looks == CLEAN_LOOKS {
                        done.unfinished = done.networks_unknown.take();
                        return done;
                    }
                }
                Ok(found) => {
                    clean_looks = 0;
                    remove(&docker, &found).await;
                    done.unfinished = Some(format!("still there at the last look: {found:?}"));
                    done.removed.containers.extend(found.containers);
                    done.removed.networks.extend(found.networks);
                }
                Err(LookFailed { why, .. }) => {
                    clean_looks = 0;
                    done.unfinished = Some(why);
                }
            }
            if Instant::now() + AGAIN_AFTER > deadline {
                return done;
            }
            tokio::time::sleep(AGAIN_AFTER).await;
        }
    })
}

async fn sessions(db_url: &str) -> Result<HashSet<String>, LookFailed> {
    let (client, conn) =
        bounded("connecting to the database", tokio_postgres::connect(db_url, tokio_postgres::NoTls)).await?;
    tokio::spawn(conn);
    let rows = bounded("listing sessions", client.query("SELECT id::text FROM sessions", &[])).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
