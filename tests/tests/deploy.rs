//! The deployment files (`deploy/`) and their configuration reference
//! (`docs/deployment.md`), checked against each other and the code:
//!
//! - `deploy/compose.yaml` passes `docker compose config` (or
//!   `docker-compose config`, Debian's Compose 1.29), which refuses unknown
//!   keys, and has the services and wiring a deployment needs;
//! - the Kubernetes manifests pass `kubernetes-validate --strict` (the
//!   official OpenAPI schemas) and hang together (selectors, probes,
//!   the autoscaler's target, the kustomization's files);
//! - every variable `kiln` reads is in the reference, and every variable
//!   the deployment files set is one `kiln` reads.
//!
//! The external validators are installed by `scripts/test`; without them the
//! schema checks say so and skip, unless `KILN_REQUIRE_DEPLOY_TOOLS` is set
//! (`scripts/test` sets it unless `=0`). The checks in Rust always run.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every YAML document of `text`, with merge keys (`<<: *anchor`) applied,
/// as JSON values.
fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| {
            let mut yaml = serde_norway::Value::deserialize(doc).expect("valid YAML");
            yaml.apply_merge().expect("valid merge keys");
            serde_json::to_value(yaml).expect("YAML as JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn tools_required() -> bool {
    std::env::var_os("KILN_REQUIRE_DEPLOY_TOOLS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn skip(test: &str, what: &str) {
    assert!(!tools_required(), "KILN_REQUIRE_DEPLOY_TOOLS is set but {what} is missing (scripts/test installs it)");
    eprintln!("\n!!!!!!!!\nSKIPPED {test}: {what} is missing (scripts/test installs it)\n!!!!!!!!\n");
}

/// The environment variables `kiln` reads: clap's `env = "…"` and direct
/// `env::var("…")` calls in the CLI, plus what its libraries read.
fn settings() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["RUST_LOG", "DOCKER_HOST"].into_iter().map(String::from).collect();
    let mut dirs = vec![root().join("cli/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = read(&path);
            for marker in ["env = \"", "env::var(\"", "env::var_os(\""] {
                for piece in text.split(marker).skip(1) {
                    let name = piece.split('"').next().unwrap();
                    if !name.is_empty()
                        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                    {
                        names.insert(name.to_owned());
                    }
                }
            }
        }
    }
    assert!(names.contains("DATABASE_URL") && names.contains("KILN_WORKER_MAX_SESSIONS"), "{names:?}");
    names
}

#[test]
fn the_configuration_reference_lists_every_variable() {
    let doc = read(&root().join("docs/deployment.md"));
    let missing: Vec<String> = settings().into_iter().filter(|name| !doc.contains(&format!("`{name}`"))).collect();
    assert!(missing.is_empty(), "docs/deployment.md does not document {missing:?}");
}

// ---- Compose ---------------------------------------------------------------

/// `docker compose` (v2) if present, else `docker-compose`.
fn compose_command() -> Option<Vec<&'static str>> {
    let works =
        |program: &str, args: &[&str]| Command::new(program).args(args).output().is_ok_and(|o| o.status.success());
    if works("docker", &["compose", "version"]) {
        Some(vec!["docker", "compose"])
    } else if works("docker-compose", &["version"]) {
        Some(vec!["docker-compose"])
    } else {
        None
    }
}

fn compose_config(compose: &[&str], file: &Path) -> Output {
    compose_config_of(compose, &[file], &["-q"])
}

/// `config` of `files` layered in order, with `extra` arguments.
fn compose_config_of(compose: &[&str], files: &[&Path], extra: &[&str]) -> Output {
    let deploy = root().join("deploy");
    let mut command = Command::new(compose[0]);
    command.args(&compose[1..]).arg("--project-directory").arg(&deploy);
    for file in files {
        command.arg("-f").arg(file);
    }
    command
        .arg("config")
        .args(extra)
        // The one variable the file requires.
        .env("KILN_JWT_SECRET", "0123456789abcdef0123456789abcdef")
        .output()
        .expect("run compose")
}

#[test]
fn the_compose_file_validates() {
    let Some(compose) = compose_command() else {
        return skip("the_compose_file_validates", "docker compose / docker-compose");
    };
    let file = root().join("deploy/compose.yaml");
    let out = compose_config(&compose, &file);
    assert!(
        out.status.success(),
        "{compose:?} config refused deploy/compose.yaml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The validator validates: an unknown key in a service is refused.
    let broken = read(&file).replacen("  api:\n", "  api:\n    restart_policy_typo: always\n", 1);
    let dir = tempfile::tempdir().unwrap();
    let broken_file = dir.path().join("compose.yaml");
    std::fs::write(&broken_file, broken).unwrap();
    let out = compose_config(&compose, &broken_file);
    assert!(!out.status.success(), "{compose:?} config accepted an unknown key");
    assert!(String::from_utf8_lossy(&out.stderr).contains("restart_policy_typo"));
}

#[test]
fn the_compose_file_wires_a_whole_deployment() {
    let doc = yaml_docs(&read(&root().join("deploy/compose.yaml"))).remove(0);
    let services = doc["services"].as_object().unwrap();
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["postgres", "sandbox-image", "migrate", "api", "worker"]));
    let command = |s: &str| services[s]["command"].clone();
    assert_eq!(command("migrate"), serde_json::json!(["migrate"]));
    assert_eq!(command("api"), serde_json::json!(["serve"]));
    assert_eq!(command("worker"), serde_json::json!(["worker"]));
    for kiln in ["migrate", "api", "worker"] {
        assert_eq!(services[kiln]["build"]["dockerfile"], "deploy/Dockerfile", "{kiln}");
        assert_eq!(services[kiln]["depends_on"]["postgres"].is_null(), kiln != "migrate", "{kiln}");
    }
    for after_migration in ["api", "worker"] {
        assert_eq!(services[after_migration]["depends_on"]["migrate"]["condition"], "service_completed_successfully");
    }
    assert_eq!(services["worker"]["depends_on"]["sandbox-image"]["condition"], "service_completed_successfully");
    assert!(services["api"]["healthcheck"]["test"].to_string().contains("/readyz"));
    let worker_volumes = services["worker"]["volumes"].to_string();
    assert!(worker_volumes.contains("/var/run/docker.sock:/var/run/docker.sock"), "{worker_volumes}");
    assert!(services["api"]["volumes"].is_null(), "the API needs no Docker engine");

    // Every variable set for Kiln is one Kiln reads.
    let known = settings();
    for kiln in ["migrate", "api", "worker"] {
        for entry in services[kiln]["environment"].as_array().unwrap() {
            let name = entry.as_str().unwrap().split('=').next().unwrap();
            assert!(known.contains(name), "compose.yaml sets {name} for {kiln}, which kiln does not read");
        }
    }
    let worker_env = services["worker"]["environment"].to_string();
    assert!(worker_env.contains("DATABASE_URL=postgres://") && worker_env.contains("KILN_SANDBOX_IMAGE="));
}

/// The egress override (docs/deployment.md, "Egress: where the proxy
/// runs") as Compose merges it: the worker in the host's network (with the
/// rights to keep its host firewall rules), Postgres
/// on the host's loopback where that worker looks for it, the egress
/// settings passed through, and nothing Kiln does not read.
#[test]
fn the_egress_override_puts_the_worker_in_the_hosts_network() {
    let known = settings();
    let doc = yaml_docs(&read(&root().join("deploy/compose.egress.yaml"))).remove(0);
    for entry in doc["services"]["worker"]["environment"].as_array().unwrap() {
        let name = entry.as_str().unwrap().split('=').next().unwrap();
        assert!(known.contains(name), "compose.egress.yaml sets {name}, which kiln does not read");
    }
    let Some(compose) = compose_command() else {
        return skip("the_egress_override_puts_the_worker_in_the_hosts_network", "docker compose / docker-compose");
    };
    let files = [root().join("deploy/compose.yaml"), root().join("deploy/compose.egress.yaml")];
    let out = compose_config_of(&compose, &[&files[0], &files[1]], &[]);
    assert!(out.status.success(), "{compose:?} config refused the override:\n{}", String::from_utf8_lossy(&out.stderr));
    let merged = yaml_docs(&String::from_utf8_lossy(&out.stdout)).remove(0);
    let worker = &merged["services"]["worker"];
    assert_eq!(worker["network_mode"], "host", "{worker}");
    // Root with NET_ADMIN in the host's network: it keeps the host
    // firewall rules that close the host to sandboxes itself.
    assert!(worker["cap_add"].to_string().contains("NET_ADMIN"), "{worker}");
    assert_eq!(worker["user"], "0:0", "{worker}");
    // Compose prints the environment as a map (v1 and v2 alike).
    let env = &worker["environment"];
    let url = env["DATABASE_URL"].as_str().unwrap_or_else(|| panic!("{env}"));
    assert!(url.contains("@127.0.0.1:5432/"), "{url}");
    let ports = merged["services"]["postgres"]["ports"].to_string();
    assert!(ports.contains("127.0.0.1") && ports.contains("5432"), "{ports}");
    // The rest of the worker is the base file's.
    assert!(worker["volumes"].to_string().contains("/var/run/docker.sock"), "{worker}");
}

// ---- Kubernetes --------------------------------------------------------------

fn manifests() -> Vec<(String, Value)> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            yaml_docs(&read(&p)).into_iter().map(move |d| (name.clone(), d))
        })
        .collect()
}

fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_KUBERNETES_VALIDATE").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let state = std::env::var_os("KILN_STATE_DIR").map_or_else(|| root().join(".kiln"), |d| root().join(d));
    let venv = state.join("tools/kubernetes-validate/bin/kubernetes-validate");
    if venv.is_file() {
        return Some(venv);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("kubernetes-validate")).find(|p| p.is_file())
}

/// The oldest Kubernetes the manifests are for: native sidecars (init
/// containers with `restartPolicy: Always`) are on by default from 1.29.
const KUBERNETES_VERSION: &str = "1.30.0";

fn validate(tool: &Path, files: &[PathBuf]) -> Output {
    Command::new(tool)
        .args(["--strict", "--quiet", "-k", KUBERNETES_VERSION])
        .args(files)
        .output()
        .expect("run kubernetes-validate")
}

#[test]
fn the_kubernetes_manifests_pass_the_schema_check() {
    let Some(tool) = kubernetes_validate() else {
        return skip("the_kubernetes_manifests_pass_the_schema_check", "kubernetes-validate");
    };
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    let out = validate(&tool, &files);
    assert!(
        out.status.success(),
        "kubernetes-validate refused the manifests:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The check is strict: a misspelt field fails it.
    let broken = read(&dir.join("api.yaml")).replacen("readinessProbe:", "readynessProbe:", 1);
    let tmp = tempfile::tempdir().unwrap();
    let broken_file = tmp.path().join("api.yaml");
    std::fs::write(&broken_file, broken).unwrap();
    let out = validate(&tool, &[broken_file]);
    assert!(!out.status.success(), "kubernetes-validate accepted an unknown field");
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str, file: &str) -> &'a Value {
    docs.iter()
        .find(|(f, d)| f == file && d["kind"] == kind && d["metadata"]["name"] == name)
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no {kind} {name} in {file}"))
}

fn containers(pod: &Value) -> Vec<&Value> {
    let spec = &pod["spec"];
    let mut all: Vec<&Value> = spec["containers"].as_array().unwrap().iter().collect();
    all.extend(spec["initContainers"].as_array().into_iter().flatten());
    all
}

#[test]
fn the_kubernetes_manifests_hang_together() {
    let docs = manifests();
    let known = settings();
    for (file, doc) in &docs {
        assert!(doc["apiVersion"].is_string() && doc["kind"].is_string(), "{file}");
        assert!(doc["metadata"]["name"].is_string(), "{file}");
        if doc["kind"] != "Namespace" {
            assert_eq!(doc["metadata"]["namespace"], "kiln", "{file}");
        }
    }

    // The kustomization names files that exist, and exactly one worker.
    let dir = root().join("deploy/kubernetes");
    let kustomization = yaml_docs(&read(&dir.join("kustomization.yaml"))).remove(0);
    let resources: Vec<&str> =
        kustomization["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for r in &resources {
        assert!(dir.join(r).is_file(), "kustomization.yaml names {r}, which does not exist");
    }
    assert_eq!(resources.iter().filter(|r| r.starts_with("worker")).count(), 1, "{resources:?}");
    assert!(!resources.contains(&"secret.example.yaml"), "the example Secret must not be applied");

    // API: probes on the health routes, a Service that selects its pods.
    let api = find(&docs, "Deployment", "kiln-api", "api.yaml");
    let pod = &api["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(&api["spec"]["selector"]["matchLabels"], labels);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["args"], serde_json::json!(["serve"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let service = find(&docs, "Service", "kiln-api", "api.yaml");
    assert_eq!(&service["spec"]["selector"], labels);
    let ingress = find(&docs, "Ingress", "kiln", "ingress.yaml");
    assert_eq!(ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"], "off");

    let job = find(&docs, "Job", "kiln-migrate", "migrate-job.yaml");
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["args"], serde_json::json!(["migrate"]));

    // Each worker variant: a worker container reaching an engine over a Unix socket.
    for file in ["worker.yaml", "worker-node-engine.yaml", "worker-remote-engine.yaml"] {
        let worker = find(&docs, "Deployment", "kiln-worker", file);
        let pod = &worker["spec"]["template"];
        assert_eq!(&worker["spec"]["selector"]["matchLabels"], &pod["metadata"]["labels"], "{file}");
        let main = &pod["spec"]["containers"][0];
        assert_eq!(main["args"], serde_json::json!(["worker"]), "{file}");
        let docker_host = main["env"].as_array().unwrap().iter().find(|e| e["name"] == "DOCKER_HOST");
        if let Some(host) = docker_host {
            assert!(
                host["value"].as_str().unwrap().starts_with("unix://"),
                "{file}: the worker speaks Unix sockets only"
            );
        }
        // Runs get the grace period to finish or hand over.
        assert!(pod["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap() > 30, "{file}");
        assert!(
            containers(pod).iter().any(|c| c["command"].to_string().contains("pull")),
            "{file}: the worker never pulls, so the sandbox image must be pulled for it"
        );
    }

    // The autoscaler targets the worker Deployment.
    let hpa = find(&docs, "HorizontalPodAutoscaler", "kiln-worker", "hpa.yaml");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "kiln-worker");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");

    // Every variable set for Kiln is one Kiln reads.
    let config = find(&docs, "ConfigMap", "kiln-config", "config.yaml");
    for name in config["data"].as_object().unwrap().keys() {
        assert!(known.contains(name), "config.yaml sets {name}, which kiln does not read");
    }
    let secret = find(&docs, "Secret", "kiln-secrets", "secret.example.yaml");
    for name in secret["stringData"].as_object().unwrap().keys() {
        assert!(known.contains(name), "secret.example.yaml sets {name}, which kiln does not read");
    }
    for (file, doc) in &docs {
        let Some(pod) = doc["spec"]["template"].as_object() else { continue };
        let pod = Value::Object(pod.clone());
        for c in containers(&pod) {
            let kiln = c["image"].as_str().unwrap().contains("/kiln:");
            for e in c["env"].as_array().into_iter().flatten() {
                let name = e["name"].as_str().unwrap();
                if kiln {
                    assert!(known.contains(name), "{file} sets {name} for kiln, which kiln does not read");
                }
            }
        }
    }
}
