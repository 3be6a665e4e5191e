//! A run's environment: its sandbox prepared by the environment's setup
//! script, or taken ready from the cache.
//!
//! 1. The checkout is made on the worker's side (as for any run), and the
//!    cache key computed from the environment, the image's id, the secrets'
//!    keyed hashes and the lock files in the checkout (`key`).
//! 2. Miss: a setup container of the environment's image (the setup
//!    phase's limits and network) gets the checkout, runs the setup script
//!    as the command user with the variables and secrets in that process's
//!    environment only (`script`), and what it left in `/workspace` and the
//!    home is committed as `kiln-env:<key>` (`cache`). The setup container
//!    then goes: secrets never reach the agent's sandbox.
//! 3. The session's sandbox is created from `kiln-env:<key>` with the
//!    run's own limits and network. On a hit its workspace is at the commit
//!    setup ran on: the run's commit is brought in as a git bundle and
//!    checked out in place (ignored files such as dependency folders stay;
//!    hooks and fsmonitor off), then the maintenance script runs. The key
//!    and the image's labels hold the run's owner and repository, so a hit
//!    is always the same tenant's same repository: its `.git` has no other
//!    repository's objects. A checkout that cannot be moved
//!    (history the bundle does not connect to) falls back to a fresh setup.

pub mod cache;
pub mod image;
pub mod key;
mod mask;
pub mod mcp;
mod repo_file;
mod script;
mod tail;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kiln_protocol::environment::REPOSITORY_FILE;
use kiln_protocol::{Environment, EnvironmentSpec, EventBody, Run};
use kiln_store::{StoreError, StoredEnvironment};

use crate::agent::Outcome;
use crate::context::WorkerContext;
use crate::db_retry;
use crate::event_sink::EventSink;
use crate::sandbox::lifecycle::{self, Origin};
use crate::sandbox::{Backend, Owner, Sandbox, SandboxConfig, SandboxError};

/// Where a run's bundle is put in the sandbox (the workspace volume: the
/// archive API cannot write to `/tmp`'s plain tmpfs).
const BUNDLE_IN_SANDBOX: &str = "/workspace/.git/kiln-run.bundle";
/// Longest the in-place checkout may take.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// The run's sandbox, prepared; or why the run fails.
pub enum Prepared {
    Ready(Box<Sandbox>, Origin),
    Failed(Outcome),
}

fn failed(error: impl Into<String>) -> Prepared {
    Prepared::Failed(Outcome::Failed { error: error.into() })
}

/// What the setup phase needs to know, gathered once.
struct Plan<'a> {
    ctx: &'a WorkerContext,
    run: &'a Run,
    owner: &'a Owner,
    stored: StoredEnvironment,
    secrets: BTreeMap<String, String>,
    setup_config: SandboxConfig,
    key: String,
    /// Whose the prepared image is (the key covers it; its labels say it).
    tenancy: key::Tenancy,
    commit: Option<String>,
    checkout: Option<&'a Path>,
}

/// Where a run's environment comes from.
pub enum Source<'a> {
    /// Named by the run: an environment of the run's owner, from the API.
    Named(&'a str),
    /// The repository's `.kiln/environment.toml` (the run names none).
    Repository(Box<EnvironmentSpec>),
}

/// The environment a run gets: the one it names, else its repository's
/// file at the base commit, else none. `Err`: why the run fails (a bad
/// file is not ignored: its author expects it to be used).
pub async fn source_of<'a>(run: &'a Run, checkout: Option<&Path>) -> Result<Option<Source<'a>>, String> {
    if let Some(name) = &run.environment {
        return Ok(Some(Source::Named(name)));
    }
    let Some(checkout) = checkout else { return Ok(None) };
    Ok(repo_file::read(checkout).await?.map(|spec| Source::Repository(Box::new(spec))))
}

/// Prepares the session's sandbox with the run's environment. `checkout`
/// is the run's repository at its base commit on the worker's side;
/// `config` is the run's sandbox (its limits and network).
pub async fn prepare(
    ctx: &WorkerContext,
    run: &Run,
    source: Source<'_>,
    checkout: Option<&Path>,
    config: &SandboxConfig,
    owner: &Owner,
    events: &mut EventSink,
) -> Result<Prepared, StoreError> {
    match plan(ctx, run, source, checkout, config, owner).await? {
        Ok(plan) => plan.prepare(config, events).await,
        Err(why) => Ok(failed(why)),
    }
}

/// What preparing the environment takes: its definition and secrets, the
/// setup sandbox, the cache key; or why the run fails before any sandbox.
async fn plan<'a>(
    ctx: &'a WorkerContext,
    run: &'a Run,
    source: Source<'_>,
    checkout: Option<&'a Path>,
    config: &SandboxConfig,
    owner: &'a Owner,
) -> Result<Result<Plan<'a>, String>, StoreError> {
    let subject = db_retry::with_retry(|| ctx.store.run_owner(run.id)).await?.unwrap_or_default();
    let repo_url = run.repo.as_ref().map(|r| r.url.as_str());
    let stored = match stored_environment(ctx, run, source, &subject, repo_url).await? {
        Ok(stored) => stored,
        Err(why) => return Ok(Err(why)),
    };
    let tenancy = key::Tenancy::new(&subject, repo_url);
    let secrets = match open_secrets(ctx, run, &stored).await? {
        Ok(secrets) => secrets,
        Err(why) => return Ok(Err(why)),
    };
    let env = &stored.environment;
    let name = &env.name;
    let (setup_config, image_id) = match setup_sandbox(ctx, env, config).await {
        Ok(setup) => setup,
        Err(why) => return Ok(Err(format!("environment {name:?}: {why}"))),
    };
    let commit = match checkout {
        Some(dir) => git_head(dir).await,
        None => None,
    };
    let locks = match lock_file_digests(checkout, &env.lock_files).await {
        Ok(locks) => locks,
        Err(e) => return Ok(Err(format!("environment {name:?}: reading its lock files failed: {e}"))),
    };
    let fingerprints: BTreeMap<String, String> = match &ctx.config.secrets_key {
        Some(k) => secrets.iter().map(|(n, v)| (n.clone(), k.fingerprint(n, v))).collect(),
        None => BTreeMap::new(),
    };
    let key = key::cache_key(&key::KeyInputs {
        tenancy: &tenancy,
        environment: env,
        image_id: &image_id,
        secret_fingerprints: &fingerprints,
        lock_files: &locks,
        user: &config.user,
    });
    Ok(Ok(Plan { ctx, run, owner, stored, secrets, setup_config, key, tenancy, commit, checkout }))
}

/// The environment the run names (the owner's, from the store), or its
/// repository's file; why there is none.
async fn stored_environment(
    ctx: &WorkerContext,
    run: &Run,
    source: Source<'_>,
    subject: &str,
    repo_url: Option<&str>,
) -> Result<Result<StoredEnvironment, String>, StoreError> {
    Ok(match source {
        Source::Named(name) => match db_retry::with_retry(|| ctx.store.environment_of_run(run.id, name)).await? {
            Some(stored) => Ok(stored),
            None => Err(format!(
                "the environment {name:?} does not exist for the run's owner (deleted after the run was queued, \
                 or named for a GitHub repository by KILN_GITHUB_ENVIRONMENTS and never created for \
                 KILN_GITHUB_OWNER_SUB)"
            )),
        },
        Source::Repository(spec) => Ok(StoredEnvironment {
            environment: from_repository(*spec, subject, repo_url.unwrap_or_default()),
            secrets_sealed: None,
            mcp_headers_sealed: BTreeMap::new(),
        }),
    })
}

/// The setup phase's sandbox (the run's, narrowed by the environment's
/// `setup_sandbox`, on the environment's image) and that image's id.
async fn setup_sandbox(
    ctx: &WorkerContext,
    env: &kiln_protocol::environment::Environment,
    config: &SandboxConfig,
) -> Result<(SandboxConfig, String), String> {
    // Checked again here: a repository's file never passed the API, and a
    // stored row may predate the rule.
    let image = match &env.image {
        Some(raw) => image::allowed(&*ctx.sandboxes, &ctx.config.environment_images, raw).await?,
        None => image::deployment(&*ctx.sandboxes, &config.image).await?,
    };
    let mut setup_config =
        config.narrowed(&env.setup_sandbox).map_err(|refusal| format!("setup_sandbox: {refusal}"))?;
    setup_config.image = image.name.clone();
    // The setup phase's network is the environment's to say, not the run's
    // (whose `sandbox.egress` is the agent phase's): the same environment
    // sets up alike for every run, and its cache key covers it.
    setup_config.egress_run = env.setup_sandbox.egress.clone();
    Ok((setup_config, image.id))
}

/// The digests of the environment's lock files in the checkout (none
/// without one), read off the async threads.
async fn lock_file_digests(checkout: Option<&Path>, globs: &[String]) -> Result<BTreeMap<String, String>, String> {
    let Some(root) = checkout else { return Ok(BTreeMap::new()) };
    let (root, globs) = (root.to_path_buf(), globs.to_vec());
    match tokio::task::spawn_blocking(move || key::lock_file_digests(&root, &globs)).await {
        Ok(Ok(locks)) => Ok(locks),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

impl Plan<'_> {
    fn name(&self) -> &str {
        &self.stored.environment.name
    }

    /// The run's sandbox, prepared, with what setup and maintenance left in
    /// the workspace kept out of the run's changes (see [`exclude_setup_files`]).
    async fn prepare(self, config: &SandboxConfig, events: &mut EventSink) -> Result<Prepared, StoreError> {
        let prepared = self.prepare_sandbox(config, events).await?;
        if let Prepared::Ready(sandbox, origin) = &prepared
            && *origin != Origin::Reused
            && let Err(why) = exclude_setup_files(sandbox).await
        {
            sandbox.remove().await;
            return Ok(failed(format!("could not record the files setup left in the workspace: {why}")));
        }
        Ok(prepared)
    }

    /// The pool of warm containers of this environment's prepared image,
    /// for a run whose sandbox is the deployment's own (no narrowed limits,
    /// no egress network: the warm containers have neither).
    fn warm_pool(
        &self,
        config: &SandboxConfig,
        agent_config: &SandboxConfig,
        restore: &str,
    ) -> Option<std::sync::Arc<crate::sandbox::pool::WarmPool>> {
        if self.run.sandbox != kiln_protocol::SandboxSpec::default() || config.wants_egress() {
            return None;
        }
        self.ctx.environment_pools.pool_for(&self.key, self.stored.environment.id, agent_config, restore)
    }

    async fn prepare_sandbox(self, config: &SandboxConfig, events: &mut EventSink) -> Result<Prepared, StoreError> {
        let sandboxes = &self.ctx.sandboxes;
        let Ok((cached, _setting_up)) = self.lookup_or_lock().await else {
            return Ok(failed("looking up the environment's cache failed"));
        };
        for attempt in 0..2 {
            let hit = attempt == 0 && cached.is_some();
            events
                .write_now(EventBody::EnvironmentStarted {
                    environment: self.name().to_owned(),
                    cache_key: self.key.clone(),
                    hit,
                    image: self.setup_config.image.clone(),
                })
                .await?;
            let found = match self.prepared_image(hit, &cached, events).await? {
                Ok(found) => found,
                Err(why) => return Ok(failed(why)),
            };
            let agent_config = SandboxConfig { image: cache::tag_of(&self.key), ..config.clone() };
            let restore = cache::restore_command(found.home.as_deref());
            // On a hit, a warm container of this image (restore done) if
            // one is ready; after a setup, the pool starts filling for the
            // next run once this run has its own sandbox.
            let pool = if hit { self.warm_pool(config, &agent_config, &restore) } else { None };
            let (sandbox, origin) =
                match lifecycle::acquire(sandboxes, &agent_config, pool.as_deref(), self.owner).await {
                    Ok(s) => s,
                    Err(e) => return Ok(failed(format!("could not start the sandbox: {e}"))),
                };
            if !hit {
                self.warm_pool(config, &agent_config, &restore);
            }
            if origin == Origin::Reused {
                return Ok(Prepared::Ready(Box::new(sandbox), origin));
            }
            if origin == Origin::Warm {
                tracing::info!(run_id = %self.run.id, key = %self.key, "a warm container of the prepared environment");
            } else if let Err(why) = restore_in(&sandbox, &restore).await {
                sandbox.remove().await;
                return Ok(failed(format!("could not restore the prepared workspace: {why}")));
            }
            if !hit {
                return Ok(Prepared::Ready(Box::new(sandbox), origin));
            }
            if let (Some(commit), Some(checkout)) = (&self.commit, self.checkout)
                && found.commit.as_deref() != Some(commit.as_str())
                && let Err(why) = self.move_to_commit(&sandbox, checkout).await
            {
                tracing::info!(run_id = %self.run.id, why, "the prepared workspace could not be moved to the run's commit; setting up afresh");
                sandbox.remove().await;
                continue;
            }
            return self.maintain(sandbox, origin, events).await;
        }
        Ok(failed("the environment's prepared sandbox could not be used"))
    }

    /// What the prepared image holds: on a hit, the cached one's (marked
    /// used); else setup runs now and stores it; `Err`: why setup failed.
    async fn prepared_image(
        &self,
        hit: bool,
        cached: &Option<cache::Found>,
        events: &mut EventSink,
    ) -> Result<Result<cache::Found, String>, StoreError> {
        let found = if hit {
            // Eviction order only: a failure costs nothing else.
            if let Err(e) = cache::touch(&*self.ctx.sandboxes, &self.key).await {
                tracing::warn!(error = %e, "marking a prepared environment image used failed");
            }
            cached.clone()
        } else {
            match self.set_up(events).await? {
                Ok(found) => Some(found),
                Err(why) => return Ok(Err(why)),
            }
        };
        Ok(Ok(found.unwrap_or(cache::Found { commit: None, home: None })))
    }

    /// The prepared image of this key, or, when there is none, the key's
    /// setup lock: runs that miss at once (a group's attempts) wait for the
    /// first to set up, then find its image. The lock is held until this
    /// run's sandbox is prepared. `Err`: the cache could not be looked up.
    async fn lookup_or_lock(&self) -> Result<(Option<cache::Found>, Option<kiln_store::SetupLock>), ()> {
        let lookup = || async {
            cache::lookup(&*self.ctx.sandboxes, &self.key, &self.tenancy).await.map_err(|e| {
                tracing::warn!(run_id = %self.run.id, error = %e, "looking up a prepared environment image failed");
            })
        };
        if let Some(found) = lookup().await? {
            return Ok((Some(found), None));
        }
        let lock = match self.ctx.store.lock_environment_setup(&self.key).await {
            Ok(lock) => Some(lock),
            // Setting up twice is wasteful, not wrong: go on without it.
            Err(e) => {
                tracing::warn!(run_id = %self.run.id, error = %e, "could not take the environment's setup lock");
                None
            }
        };
        Ok((lookup().await?, lock))
    }

    /// The setup phase: what the prepared image says of itself; `Err`: why
    /// the run fails.
    ///
    /// With egress, the setup container sits on the session's internal
    /// network and its own proxy serves it, judging by the environment's
    /// setup policy (within the deployment's) and writing its decisions into
    /// the run's stream. Container, proxy and network all go before the
    /// agent phase's sandbox is made: that one gets its own policy, its own
    /// proxy (or no network at all), and nothing of setup's settings (the
    /// prepared image is committed from a fresh container, see `cache`).
    async fn set_up(&self, events: &mut EventSink) -> Result<Result<cache::Found, String>, StoreError> {
        let name = self.name();
        let session_id = self.owner.session_id;
        let started = Sandbox::start_setup(&self.ctx.sandboxes, &self.setup_config, self.owner).await;
        let setup = match started {
            Ok(s) => s,
            // (A container that failed to start took its network with it.)
            Err(e) => return Ok(Err(format!("environment {name:?}: could not start the setup sandbox: {e}"))),
        };
        // Whatever happens from here on (the run cancelled mid-setup too),
        // the setup container goes, and the network it was on after it.
        let network_of = self.setup_config.wants_egress().then_some(session_id);
        let firewall = self.setup_config.egress.host_firewall.clone();
        let backend = self.ctx.sandboxes.clone();
        let mut gone = RemoveOnDrop { backend, id: setup.id().to_owned(), network_of, firewall };
        let proxy = if self.setup_config.wants_egress() {
            let layers = self.setup_config.egress_layers();
            let (settings, phase) = (&self.setup_config.egress, crate::egress::Phase::Setup);
            // The setup container holds the secrets: what its proxy shows is masked too.
            let redact = Some(mask::redactor(self.secrets.values().cloned()));
            let serving = crate::sandbox::serve_egress(
                &self.ctx.sandboxes,
                settings,
                layers,
                phase,
                session_id,
                setup.id(),
                redact,
            );
            match serving.await {
                Ok(proxy) => proxy,
                Err(e) => {
                    return Ok(Err(format!("environment {name:?}: could not start the setup's egress proxy: {e}")));
                }
            }
        } else {
            None
        };
        if let Some(proxy) = &proxy {
            events.attach_network_log(proxy.log.clone());
        }
        let result = self.set_up_in(&setup, events).await;
        // In this order: the proxy's last decisions into the stream, the
        // proxy off its address, the container off the network, the network.
        events.detach_network_log();
        if let Some(proxy) = proxy {
            proxy.stop().await;
        }
        gone.now().await;
        let result = result?;
        // What the proxy decided after the last event setup wrote.
        events.commit().await?;
        Ok(result)
    }

    async fn set_up_in(
        &self,
        setup: &Sandbox,
        events: &mut EventSink,
    ) -> Result<Result<cache::Found, String>, StoreError> {
        let name = self.name();
        let env = &self.stored.environment;
        if let Some(checkout) = self.checkout
            && let Err(e) = setup.upload_dir(checkout, self.ctx.config.clone_settings().max_bytes).await
        {
            return Ok(Err(format!("could not prepare the workspace: {e}")));
        }
        let mut vars: Vec<String> = env.variables.iter().map(|(k, v)| format!("{k}={v}")).collect();
        vars.extend(self.secrets.iter().map(|(k, v)| format!("{k}={v}")));
        let mask: Vec<&str> = self.secrets.values().map(String::as_str).collect();
        let user = &self.setup_config.user;
        let Some(shell) = script::shell_of(setup) else {
            return Ok(Err(format!(
                "environment {name:?}: the setup script needs a shell (bash or sh) in the image {:?}, which has none",
                self.setup_config.image
            )));
        };
        let script = script::Script {
            sandbox: setup,
            user,
            shell,
            text: &env.setup_script,
            env: vars,
            phase: "setup",
            mask: &mask,
        };
        let ran = script::run(script, events).await?;
        tracing::info!(run_id = %self.run.id, environment = %name, ok = ran.is_ok(), "setup script ended");
        let end = match ran {
            Ok(end) => end,
            Err(e) => return Ok(Err(format!("environment {name:?}: running setup failed: {e}"))),
        };
        let duration_ms = end.duration.as_millis() as u64;
        if end.exit_code != Some(0) {
            let exit_code = end.exit_code.unwrap_or(-1);
            events.write_now(EventBody::environment_finished("setup".into(), exit_code, duration_ms, false)).await?;
            return Ok(Err(format!(
                "environment {name:?}: setup failed with exit status {exit_code}; the last lines of its output:\n{}",
                end.tail
            )));
        }
        let home = match self.store_prepared(setup).await {
            Ok(home) => home,
            Err(why) => return Ok(Err(format!("environment {name:?}: {why}"))),
        };
        events.write_now(EventBody::environment_finished("setup".into(), 0, duration_ms, true)).await?;
        Ok(Ok(cache::Found { commit: self.commit.clone(), home }))
    }

    /// Stores the set-up container as this key's prepared image and bounds
    /// the cache; where the image keeps the home, or why it was not stored.
    async fn store_prepared(&self, setup: &Sandbox) -> Result<Option<String>, String> {
        let sandboxes = &self.ctx.sandboxes;
        let env = &self.stored.environment;
        let home = sandboxes.kept_home(&self.setup_config).await.map_err(|e| e.to_string())?;
        let snapshot = cache::Snapshot {
            from: setup.id(),
            image: &self.setup_config.image,
            home: home.clone(),
            key: &self.key,
            run_id: self.run.id,
            environment_id: env.id,
            tenancy: &self.tenancy,
            commit: self.commit.as_deref(),
            scope: &self.ctx.config.environment_cache.scope,
            variables: env.variables.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        };
        let storing = std::time::Instant::now();
        let stored = cache::store(&**sandboxes, &snapshot).await;
        tracing::info!(run_id = %self.run.id, key = %self.key, ms = storing.elapsed().as_millis() as u64, ok = stored.is_ok(), "prepared image stored");
        if let Err(e) = stored {
            return Err(format!("storing the prepared sandbox failed: {e}"));
        }
        let evicting = std::time::Instant::now();
        let evicted =
            cache::evict(sandboxes, &self.ctx.config.environment_cache, &self.key, &self.ctx.environment_pools).await;
        tracing::info!(run_id = %self.run.id, ms = evicting.elapsed().as_millis() as u64, "environment cache bounded");
        if let Err(e) = evicted {
            tracing::warn!(error = %e, "bounding the environment cache failed");
        }
        Ok(home)
    }

    /// Brings the run's commit into the prepared workspace and checks it
    /// out in place; `Err`: why not (the caller sets up afresh).
    async fn move_to_commit(&self, sandbox: &Sandbox, checkout: &Path) -> Result<(), String> {
        let bundle = checkout.with_file_name("run.bundle");
        let made = git(checkout, &["bundle", "create", &bundle.to_string_lossy(), "HEAD"]).await;
        if !made.is_some_and(|o| o.status.success()) {
            return Err("git bundle failed".into());
        }
        let bytes = tokio::fs::read(&bundle).await.map_err(|e| e.to_string())?;
        if bytes.len() as u64 > self.ctx.config.clone_settings().max_bytes {
            return Err("the bundle is larger than KILN_MAX_REPO_MB".into());
        }
        sandbox.write_file(BUNDLE_IN_SANDBOX, &bytes).await.map_err(|e| e.to_string())?;
        // Nothing the prepared `.git` holds runs here: no hook (setup, or a
        // package's install script, may have left one) and no fsmonitor
        // command from its config.
        let command = format!(
            "g='git -c core.hooksPath=/dev/null -c core.fsmonitor=false'; \
             $g fetch --quiet --no-tags {BUNDLE_IN_SANDBOX} HEAD && $g checkout --quiet --force --detach FETCH_HEAD; \
             s=$?; rm -f {BUNDLE_IN_SANDBOX}; exit $s"
        );
        let out = sandbox.exec(&command, CHECKOUT_TIMEOUT, 16 * 1024, |_| {}).await.map_err(|e| e.to_string())?;
        match out.exit_code {
            Some(0) => Ok(()),
            _ => Err(format!("git in the sandbox: {}", out.output.trim())),
        }
    }

    /// Runs the maintenance script, if any, in the session's sandbox.
    async fn maintain(&self, sandbox: Sandbox, origin: Origin, events: &mut EventSink) -> Result<Prepared, StoreError> {
        let Some(maintenance) = &self.stored.environment.maintenance_script else {
            return Ok(Prepared::Ready(Box::new(sandbox), origin));
        };
        // The variables are the prepared image's environment already.
        let user = &self.setup_config.user;
        let Some(shell) = script::shell_of(&sandbox) else {
            sandbox.remove().await;
            return Ok(failed(format!(
                "environment {:?}: the maintenance script needs a shell (bash or sh) in the image, which has none",
                self.name()
            )));
        };
        let script = script::Script {
            sandbox: &sandbox,
            user,
            shell,
            text: maintenance,
            env: Vec::new(),
            phase: "maintenance",
            mask: &[],
        };
        let ran = script::run(script, events).await?;
        let (exit_code, duration_ms, tail) = match ran {
            Ok(end) => (end.exit_code.unwrap_or(-1), end.duration.as_millis() as u64, end.tail),
            Err(e) => (-1, 0, e.to_string()),
        };
        events.write_now(EventBody::environment_finished("maintenance".into(), exit_code, duration_ms, false)).await?;
        if exit_code != 0 {
            sandbox.remove().await;
            return Ok(failed(format!(
                "environment {:?}: maintenance failed with exit status {exit_code}; the last lines of its output:\n{tail}",
                self.name()
            )));
        }
        Ok(Prepared::Ready(Box::new(sandbox), origin))
    }
}

/// Keeps the untracked files that setup, the restore and maintenance
/// left in the workspace (a dependency folder the repository does not
/// ignore, a tool's file) out of the run's changes: they are added to the
/// workspace's `.git/info/exclude`, so the delivery's `git add -A` passes
/// them by and its patch holds only what the agent changed. Directories
/// are listed whole (`--directory`); each path is anchored and its glob
/// characters escaped. (A path git would quote, one with a newline or a
/// double quote, stays a change.)
async fn exclude_setup_files(sandbox: &Sandbox) -> Result<(), String> {
    let command = r#"cd /workspace && [ -d .git ] || exit 0
list=$(git -c core.quotePath=false ls-files --others --exclude-standard --directory) || exit 1
[ -n "$list" ] || exit 0
mkdir -p .git/info && printf '%s
' "$list" | sed -e 's/[][*?\]/\&/g' -e 's/ $/\ /' -e 's|^|/|' >> .git/info/exclude"#;
    let out = sandbox.exec(command, CHECKOUT_TIMEOUT, 16 * 1024, |_| {}).await.map_err(|e| e.to_string())?;
    match out.exit_code {
        Some(0) => Ok(()),
        _ => Err(out.output.trim().to_owned()),
    }
}

/// The environment's secrets in clear; `Err`: why they cannot be had.
/// Puts setup's workspace and home back in a container started from the
/// prepared image; why it could not.
async fn restore_in(sandbox: &Sandbox, restore: &str) -> Result<(), String> {
    match sandbox.exec(restore, CHECKOUT_TIMEOUT, 16 * 1024, |_| {}).await {
        Ok(out) if out.exit_code == Some(0) => Ok(()),
        Ok(out) => Err(out.output.trim().to_owned()),
        Err(SandboxError::NoShell { image }) => {
            Err(format!("that needs sh and cp in the image {image:?}, which has no shell"))
        }
        Err(e) => Err(e.to_string()),
    }
}

async fn open_secrets(
    ctx: &WorkerContext,
    run: &Run,
    stored: &StoredEnvironment,
) -> Result<Result<BTreeMap<String, String>, String>, StoreError> {
    let Some(sealed) = &stored.secrets_sealed else { return Ok(Ok(BTreeMap::new())) };
    let Some(key) = &ctx.config.secrets_key else {
        return Ok(Err(format!(
            "the environment {:?} has secrets, and this worker has no KILN_SECRETS_KEY to open them",
            stored.environment.name
        )));
    };
    let owner = db_retry::with_retry(|| ctx.store.run_owner(run.id)).await?.unwrap_or_default();
    let at = kiln_store::secrets::Sealed::secrets(&owner, stored.environment.id);
    Ok(key.open(&at, sealed).map_err(|e| e.to_string()))
}

/// The environment of a repository's file, as if stored: its id is the
/// owner's and the repository's (the cache is never shared across
/// subjects, nor across repositories), its name the file's path.
fn from_repository(spec: EnvironmentSpec, subject: &str, url: &str) -> Environment {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in ["kiln-repository-environment", subject, url] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize()[..16]);
    let lock_files = spec.lock_files();
    let now = chrono::Utc::now();
    Environment {
        id: uuid::Uuid::from_bytes(id),
        name: REPOSITORY_FILE.to_owned(),
        image: spec.image,
        setup_script: spec.setup_script,
        maintenance_script: spec.maintenance_script,
        variables: spec.variables,
        secret_names: Vec::new(),
        lock_files,
        setup_sandbox: spec.setup_sandbox.unwrap_or_default(),
        cache_generation: 0,
        mcp_servers: spec.mcp_servers.iter().map(|(n, s)| (n.clone(), s.view(Vec::new()))).collect(),
        created_at: now,
        updated_at: now,
    }
}

/// Runs git in the worker's own checkout, with none of the worker's git
/// configuration.
async fn git(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()
}

/// The commit checked out in `dir`.
async fn git_head(dir: &Path) -> Option<String> {
    let out = git(dir, &["rev-parse", "HEAD"]).await.filter(|o| o.status.success())?;
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!sha.is_empty()).then_some(sha)
}

/// Removes a container, then the session network it was on, when dropped
/// (by a task: `Drop` cannot wait) or at [`RemoveOnDrop::now`].
struct RemoveOnDrop {
    backend: Backend,
    id: String,
    network_of: Option<uuid::Uuid>,
    /// Whose rules go with the network.
    firewall: std::sync::Arc<crate::egress::host_firewall::HostFirewall>,
}

impl RemoveOnDrop {
    async fn now(&mut self) {
        remove_with_network(&self.backend, &self.firewall, &std::mem::take(&mut self.id), self.network_of.take()).await;
    }
}

async fn remove_with_network(
    backend: &Backend,
    firewall: &crate::egress::host_firewall::HostFirewall,
    id: &str,
    network_of: Option<uuid::Uuid>,
) {
    if !id.is_empty() {
        backend.remove(id).await;
    }
    if let Some(session_id) = network_of {
        backend.remove_session_network(firewall, session_id).await;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.id.is_empty() && self.network_of.is_none() {
            return;
        }
        let (backend, id, network_of) = (self.backend.clone(), std::mem::take(&mut self.id), self.network_of.take());
        let firewall = self.firewall.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { remove_with_network(&backend, &firewall, &id, network_of).await });
        }
    }
}
