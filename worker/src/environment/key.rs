//! The cache key of a prepared sandbox: a hash of whose it is and of
//! everything setup's result depends on. Whose: the run's owner (tenant)
//! and its repository, so no tenant starts from another's prepared files
//! and no repository's run sees another's `.git` objects or hooks, even
//! through one named environment mapped to several repositories. The image by id (a re-pushed tag misses), both
//! scripts, the variables, the secrets by name and keyed hash (a changed
//! value misses; the key does not reveal it), the lock files' contents,
//! the environment's cache generation (reset cache), who commands run as and
//! the setup phase's network (its mode and egress policy: what setup could
//! reach decides what it installed). Not the environment's MCP servers:
//! they are the agent's, not setup's, so changing them keeps the cache.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use globset::{Glob, GlobSet, GlobSetBuilder};
use kiln_protocol::Environment;
use sha2::{Digest, Sha256};

/// Files looked at when matching lock files, at most: a repository of
/// millions of files is not walked to the end.
const MAX_WALK: usize = 200_000;
/// Bytes of lock files hashed, at most (the rest of a file past it is not
/// read; the file's size still counts).
const MAX_LOCK_BYTES: u64 = 256 * 1024 * 1024;
/// Changes whenever what a key covers changes, so old images miss.
const KEY_VERSION: &str = "kiln-environment-key-3";

/// Whose a prepared sandbox is: the run's owner and its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenancy {
    /// The run's owner (the subject).
    pub owner: String,
    /// The run's repository URL, normalised (empty: a run without one).
    pub repository: String,
}

impl Tenancy {
    /// `repo_url` is normalised, so two spellings of one URL share a cache;
    /// one that does not parse is taken as it is.
    pub fn new(owner: &str, repo_url: Option<&str>) -> Tenancy {
        let repository = match repo_url {
            Some(url) => kiln_protocol::repo_url::parse_repo_url(url).map(|u| u.normalized).unwrap_or(url.to_owned()),
            None => String::new(),
        };
        Tenancy { owner: owner.to_owned(), repository }
    }

    /// What the prepared image's owner label holds: a hash, so the engine's
    /// image list does not spell out subjects.
    pub fn owner_label(&self) -> String {
        label_hash("owner", &self.owner)
    }

    /// What the prepared image's repository label holds.
    pub fn repository_label(&self) -> String {
        label_hash("repository", &self.repository)
    }
}

fn label_hash(what: &str, value: &str) -> String {
    let mut h = Sha256::new();
    h.update(what.as_bytes());
    h.update((value.len() as u64).to_le_bytes());
    h.update(value.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// What the key is made of.
pub struct KeyInputs<'a> {
    pub tenancy: &'a Tenancy,
    pub environment: &'a Environment,
    /// The image's id (`sha256:…`) on this engine.
    pub image_id: &'a str,
    /// Secret name → keyed hash of its value.
    pub secret_fingerprints: &'a BTreeMap<String, String>,
    /// Lock file path → SHA-256 of its contents.
    pub lock_files: &'a BTreeMap<String, String>,
    /// `uid:gid` commands run as.
    pub user: &'a str,
}

/// The key, 32 hex digits (128 bits): a Docker tag and an event field.
pub fn cache_key(inputs: &KeyInputs<'_>) -> String {
    let env = inputs.environment;
    let mut h = Sha256::new();
    let mut field = |name: &str, value: &str| {
        // Length-prefixed, so no two different inputs hash alike.
        h.update(name.as_bytes());
        h.update((value.len() as u64).to_le_bytes());
        h.update(value.as_bytes());
    };
    field("version", KEY_VERSION);
    field("owner", &inputs.tenancy.owner);
    field("repository", &inputs.tenancy.repository);
    field("environment", &env.id.to_string());
    field("generation", &env.cache_generation.to_string());
    field("image", inputs.image_id);
    field("user", inputs.user);
    field("setup", &env.setup_script);
    field("maintenance", env.maintenance_script.as_deref().unwrap_or("\0none"));
    // Serialised: the policy's fields and rules in their stated order.
    let network = serde_json::to_string(&(env.setup_sandbox.network, &env.setup_sandbox.egress)).unwrap_or_default();
    field("setup network", &network);
    for (k, v) in &env.variables {
        field("variable", k);
        field("value", v);
    }
    for (k, v) in inputs.secret_fingerprints {
        field("secret", k);
        field("fingerprint", v);
    }
    for (path, digest) in inputs.lock_files {
        field("lock", path);
        field("digest", digest);
    }
    hex::encode(&h.finalize()[..16])
}

/// The lock files of the checkout at `root` matched by `globs`, with the
/// SHA-256 of each. A glob without `/` matches a file's name at any depth
/// (`package-lock.json` of every package of a monorepo); one with `/`
/// matches the path from the root. `.git` is not looked into.
pub fn lock_file_digests(root: &Path, globs: &[String]) -> std::io::Result<BTreeMap<String, String>> {
    let (by_name, by_path) = glob_sets(globs)?;
    let mut found = BTreeMap::new();
    let mut budget = MAX_LOCK_BYTES;
    let mut seen = 0usize;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            seen += 1;
            if seen > MAX_WALK {
                return Ok(found);
            }
            let path = entry.path();
            let kind = entry.file_type()?;
            let Ok(rel) = path.strip_prefix(root) else { continue };
            let rel = rel.to_string_lossy().into_owned();
            if kind.is_dir() {
                if rel != ".git" {
                    stack.push(path);
                }
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if by_name.is_match(&name) || by_path.is_match(&rel) {
                let (digest, read) = digest_file(&path, budget)?;
                budget = budget.saturating_sub(read);
                found.insert(rel, digest);
            }
        }
    }
    Ok(found)
}

fn glob_sets(globs: &[String]) -> std::io::Result<(GlobSet, GlobSet)> {
    let invalid = |e: globset::Error| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string());
    let mut by_name = GlobSetBuilder::new();
    let mut by_path = GlobSetBuilder::new();
    for g in globs {
        let glob = globset::GlobBuilder::new(g).literal_separator(true).build().or_else(|_| Glob::new(g));
        let glob = glob.map_err(invalid)?;
        if g.contains('/') {
            by_path.add(glob);
        } else {
            by_name.add(glob);
        }
    }
    Ok((by_name.build().map_err(invalid)?, by_path.build().map_err(invalid)?))
}

/// SHA-256 of the file's size and up to `limit` of its bytes.
fn digest_file(path: &Path, limit: u64) -> std::io::Result<(String, u64)> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut h = Sha256::new();
    h.update(size.to_le_bytes());
    let mut reader = file.take(limit);
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        read += n as u64;
        h.update(&buf[..n]);
    }
    Ok((hex::encode(h.finalize()), read))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment() -> Environment {
        Environment {
            id: uuid::Uuid::nil(),
            name: "e".into(),
            image: None,
            setup_script: "make deps".into(),
            maintenance_script: None,
            variables: BTreeMap::from([("A".into(), "1".into())]),
            secret_names: vec![],
            lock_files: vec![],
            setup_sandbox: Default::default(),
            cache_generation: 0,
            mcp_servers: BTreeMap::new(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn every_input_changes_the_key() {
        let env = environment();
        let none = BTreeMap::new();
        let key = |env: &Environment, image: &str, secrets: &BTreeMap<String, String>, locks| {
            cache_key(&KeyInputs {
                tenancy: &tenancy(),
                environment: env,
                image_id: image,
                secret_fingerprints: secrets,
                lock_files: locks,
                user: "1000:1000",
            })
        };
        let base = key(&env, "sha256:a", &none, &none);
        assert_eq!(base.len(), 32);
        assert_eq!(base, key(&env, "sha256:a", &none, &none));
        assert_ne!(base, key(&env, "sha256:b", &none, &none));
        let secret = BTreeMap::from([("T".into(), "f1".into())]);
        assert_ne!(base, key(&env, "sha256:a", &secret, &none));
        let lock = BTreeMap::from([("Cargo.lock".into(), "d".into())]);
        assert_ne!(base, key(&env, "sha256:a", &none, &lock));
        for change in [
            |e: &mut Environment| e.setup_script.push(' '),
            |e: &mut Environment| e.maintenance_script = Some(String::new()),
            |e: &mut Environment| e.cache_generation += 1,
            |e: &mut Environment| {
                e.variables.insert("A".into(), "2".into());
            },
            |e: &mut Environment| e.setup_sandbox.network = Some(kiln_protocol::NetworkMode::Bridge),
            |e: &mut Environment| e.setup_sandbox.egress = Some(allowlist(&["pypi.org"])),
        ] {
            let mut changed = environment();
            change(&mut changed);
            assert_ne!(base, key(&changed, "sha256:a", &none, &none));
        }
    }

    fn tenancy() -> Tenancy {
        Tenancy::new("alice", Some("https://example.com/x.git"))
    }

    #[test]
    fn the_owner_and_the_repository_are_in_the_key() {
        let (env, none) = (environment(), BTreeMap::new());
        let key = |tenancy: &Tenancy| {
            let inputs = KeyInputs {
                tenancy,
                environment: &env,
                image_id: "sha256:a",
                secret_fingerprints: &none,
                lock_files: &none,
                user: "1000:1000",
            };
            cache_key(&inputs)
        };
        let base = key(&tenancy());
        assert_eq!(base, key(&Tenancy::new("alice", Some("HTTPS://EXAMPLE.com/x.git"))), "one URL, two spellings");
        assert_ne!(base, key(&Tenancy::new("bob", Some("https://example.com/x.git"))), "another tenant");
        assert_ne!(base, key(&Tenancy::new("alice", Some("https://example.com/y.git"))), "another repository");
        assert_ne!(base, key(&Tenancy::new("alice", None)), "no repository");
        assert_ne!(tenancy().owner_label(), Tenancy::new("bob", None).owner_label());
    }

    fn allowlist(hosts: &[&str]) -> kiln_protocol::egress::EgressPolicy {
        kiln_protocol::egress::EgressPolicy {
            mode: kiln_protocol::egress::EgressMode::Allowlist,
            allow: Some(hosts.iter().map(|h| kiln_protocol::egress::HostRule::host(h, vec![443])).collect()),
        }
    }

    #[test]
    fn the_setup_phases_network_policy_is_in_the_key() {
        let none = BTreeMap::new();
        let key = |env: &Environment| {
            cache_key(&KeyInputs {
                tenancy: &tenancy(),
                environment: env,
                image_id: "sha256:a",
                secret_fingerprints: &none,
                lock_files: &none,
                user: "1000:1000",
            })
        };
        let mut one = environment();
        one.setup_sandbox.egress = Some(allowlist(&["pypi.org"]));
        let mut other = environment();
        other.setup_sandbox.egress = Some(allowlist(&["pypi.org", "files.pythonhosted.org"]));
        assert_ne!(key(&one), key(&other), "another allow-list");
        other.setup_sandbox.egress = Some(allowlist(&["pypi.org"]));
        assert_eq!(key(&one), key(&other), "the same policy");
        // Setup's limits (not its network) are left out.
        other.setup_sandbox.memory_mb = Some(512);
        assert_eq!(key(&one), key(&other));
        // So are the MCP servers: the agent's, not setup's; changing them
        // keeps the prepared sandboxes.
        let server = kiln_protocol::mcp::McpServerSpec { command: Some("srv".into()), ..Default::default() };
        other.mcp_servers.insert("tools".into(), server.view(Vec::new()));
        assert_eq!(key(&one), key(&other));
    }

    #[test]
    fn lock_files_match_by_name_at_any_depth_or_by_path_and_skip_git() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, body) in [
            ("Cargo.lock", "a"),
            ("web/package-lock.json", "b"),
            ("requirements-dev.txt", "c"),
            ("src/main.rs", "d"),
            (".git/Cargo.lock", "e"),
            ("tools/go.sum", "f"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), body).unwrap();
        }
        let globs: Vec<String> =
            ["Cargo.lock", "package-lock.json", "requirements*.txt", "go.sum"].iter().map(|s| s.to_string()).collect();
        let found = lock_file_digests(root, &globs).unwrap();
        let names: Vec<&str> = found.keys().map(String::as_str).collect();
        assert_eq!(names, ["Cargo.lock", "requirements-dev.txt", "tools/go.sum", "web/package-lock.json"]);
        let only_root = lock_file_digests(root, &["web/*.json".to_owned()]).unwrap();
        assert_eq!(only_root.keys().collect::<Vec<_>>(), ["web/package-lock.json"]);
        std::fs::write(root.join("Cargo.lock"), "changed").unwrap();
        assert_ne!(lock_file_digests(root, &globs).unwrap()["Cargo.lock"], found["Cargo.lock"]);
    }
}
