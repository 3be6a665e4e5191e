//! What a test's workers leave in Docker: the containers labelled with their
//! ids (sessions' sandboxes and warm ones) and the networks of the test's
//! sessions. A worker removes them itself when a run ends or it shuts down,
//! but a test ends without waiting for that (the worker tasks die with the
//! test's runtime), and a failing test ends anywhere. The harness removes
//! them when a [`crate::TestApp`] drops: only its own, found by its workers'
//! ids and its own database's sessions, never another test's.

use std::collections::{HashMap, HashSet};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, RemoveContainerOptions};
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

/// The containers of `workers` (any state) and the networks of the sessions
/// in the database at `db_url`.
pub async fn find(docker: &Docker, db_url: &str, workers: &[String]) -> Leftovers {
    let mut containers = Vec::new();
    for worker in workers {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_WORKER}={worker}")])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        for c in docker.list_containers(Some(options)).await.unwrap_or_default() {
            let name = c.names.and_then(|n| n.into_iter().next()).map(|n| n.trim_start_matches('/').to_owned());
            containers.extend(name.or(c.id));
        }
    }
    let sessions = sessions(db_url).await;
    let mut networks = Vec::new();
    if !sessions.is_empty() {
        let filters = HashMap::from([("label".to_owned(), vec![LABEL_SESSION.to_owned()])]);
        for n in docker.list_networks(Some(ListNetworksOptions { filters: Some(filters) })).await.unwrap_or_default() {
            let session = n.labels.as_ref().and_then(|l| l.get(LABEL_SESSION));
            if session.is_some_and(|s| sessions.contains(s)) {
                networks.extend(n.name);
            }
        }
    }
    Leftovers { containers, networks }
}

/// Removes `leftovers` (containers first: a network in use cannot go).
pub async fn remove(docker: &Docker, leftovers: &Leftovers) {
    for name in &leftovers.containers {
        let _ = docker.remove_container(name, Some(RemoveContainerOptions { force: true, ..Default::default() })).await;
    }
    for name in &leftovers.networks {
        let _ = docker.remove_network(name).await;
    }
}

/// Finds and removes what `workers` left, from a thread of its own: a
/// `Drop` cannot await, and the test's runtime may be the one it runs on.
/// Where something was left, looks again a moment later: a container the
/// engine was still creating when the test ended shows up only then.
pub fn clean_up(db_url: String, workers: Vec<String>) -> Leftovers {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let Ok(docker) = Docker::connect_with_local_defaults() else { return Leftovers::default() };
            let mut removed = Leftovers::default();
            for _ in 0..LOOKS {
                let found = find(&docker, &db_url, &workers).await;
                if found.is_empty() {
                    break;
                }
                remove(&docker, &found).await;
                removed.containers.extend(found.containers);
                removed.networks.extend(found.networks);
                tokio::time::sleep(AGAIN_AFTER).await;
            }
            removed
        })
    })
    .join()
    .unwrap_or_default()
}

/// How many times [`clean_up`] looks, at most, and how long it waits
/// between looks.
const LOOKS: usize = 3;
const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

async fn sessions(db_url: &str) -> HashSet<String> {
    let Ok((client, conn)) = tokio_postgres::connect(db_url, tokio_postgres::NoTls).await else {
        return HashSet::new();
    };
    tokio::spawn(conn);
    let rows = client.query("SELECT id::text FROM sessions", &[]).await.unwrap_or_default();
    rows.iter().map(|r| r.get(0)).collect()
}
