//! Which images an environment may start from: a name the operator allows
//! (`KILN_ENVIRONMENT_IMAGES`), never an image id, an id prefix or one of
//! Kiln's own images.
//!
//! Why so strict: the engine resolves a bare hex string as a unique prefix
//! of any image's id, and Kiln's prepared images (`kiln-env:<key>`) hold
//! what another tenant's setup left in its workspace and home. A tenant
//! that could name either could start from another tenant's files. The API
//! checks an environment's image when it is stored, and the worker again
//! before it is used (a repository's `.kiln/environment.toml`, rows stored
//! before the rule); both read these rules.

use std::fmt;

/// Image repositories Kiln makes (prepared environments) or might make:
/// refused whatever a pattern says.
const RESERVED_PREFIXES: &[&str] = &["kiln-env", "kiln-snapshot", "kiln-probe", "kiln-warm"];
/// Docker Hub's spellings of a familiar name (`node` is
/// `docker.io/library/node`); stripped before names are compared.
const HUB_PREFIXES: &[&str] = &["docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"];

/// Why an image name is refused. Shown to the tenant by the API; the
/// worker says only [`NOT_AVAILABLE`] (see `worker::environment`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefusal {
    #[error(
        "image {0:?} is not an image name: give `repository[:tag]` or `repository@sha256:<digest>` (image ids and \
         id prefixes are not accepted)"
    )]
    NotAName(String),
    #[error("image {0:?} is one of Kiln's own images, which no environment may start from")]
    Reserved(String),
    #[error("image {0:?} is not available to this deployment (the images allowed are set by KILN_ENVIRONMENT_IMAGES)")]
    NotAllowed(String),
}

/// A checked image name in canonical form: `repository:tag` (the tag
/// `latest` when none was given) or `repository@sha256:<hex>`, Docker
/// Hub's familiar names without their `docker.io/library/` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageName {
    repository: String,
    reference: Reference,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reference {
    Tag(String),
    Digest(String),
}

impl ImageName {
    /// Parses `raw` as a repository name with an optional tag or digest.
    /// Refused: anything the engine could read as an image id or id
    /// prefix (`sha256:…`, a bare hex string), and Kiln's own names.
    pub fn parse(raw: &str) -> Result<ImageName, ImageRefusal> {
        let not_a_name = || ImageRefusal::NotAName(raw.to_owned());
        // `sha256:<prefix>` reads as a name with a tag, but the engine
        // resolves it as an id (prefix) when no such name exists.
        if ["sha256:", "sha384:", "sha512:"].iter().any(|a| raw.starts_with(a)) {
            return Err(not_a_name());
        }
        let (name, reference) = match raw.split_once('@') {
            Some((name, digest)) if is_digest(digest) => (name, Reference::Digest(digest.to_owned())),
            Some(_) => return Err(not_a_name()),
            None => match raw.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')) {
                Some((name, tag)) if is_tag(tag) => (name, Reference::Tag(tag.to_owned())),
                Some(_) => return Err(not_a_name()),
                None => (raw, Reference::Tag("latest".to_owned())),
            },
        };
        let repository = familiar(name);
        if !is_repository(repository) || is_hex(repository) {
            return Err(not_a_name());
        }
        if is_reserved(repository) {
            return Err(ImageRefusal::Reserved(raw.to_owned()));
        }
        Ok(ImageName { repository: repository.to_owned(), reference })
    }

    /// The repository, familiar form (`node`, `ghcr.io/acme/build`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The name with a tag: what `RepoTags` lists for it (`None` for a
    /// name by digest).
    pub fn tagged(&self) -> Option<String> {
        match &self.reference {
            Reference::Tag(tag) => Some(format!("{}:{tag}", self.repository)),
            Reference::Digest(_) => None,
        }
    }
}

impl fmt::Display for ImageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reference {
            Reference::Tag(tag) => write!(f, "{}:{tag}", self.repository),
            Reference::Digest(digest) => write!(f, "{}@{digest}", self.repository),
        }
    }
}

/// The images environments may start from (`KILN_ENVIRONMENT_IMAGES`):
/// patterns of canonical names, each exact or ending in `*` (a prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePatterns {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl ImagePatterns {
    /// Comma-separated patterns: `repository[:tag]`, `repository@digest`,
    /// or either cut short by a trailing `*` (`node:*`, `ghcr.io/acme/*`).
    /// A pattern without a tag means `:latest`, as Docker reads it.
    pub fn parse(list: &str) -> Result<ImagePatterns, String> {
        let mut patterns = Vec::new();
        for raw in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let pattern = match raw.strip_suffix('*') {
                Some(prefix) if prefix.chars().all(is_name_char) => Pattern::Prefix(familiar(prefix).to_owned()),
                Some(_) => return Err(format!("{raw:?}: only a trailing '*' and image name characters")),
                None => Pattern::Exact(ImageName::parse(raw).map_err(|e| e.to_string())?.to_string()),
            };
            patterns.push(pattern);
        }
        Ok(ImagePatterns { patterns })
    }

    /// `raw` as a checked name, if it is one this deployment allows.
    pub fn check(&self, raw: &str) -> Result<ImageName, ImageRefusal> {
        let name = ImageName::parse(raw)?;
        let canonical = name.to_string();
        let allowed = self.patterns.iter().any(|p| match p {
            Pattern::Exact(exact) => *exact == canonical,
            Pattern::Prefix(prefix) => canonical.starts_with(prefix.as_str()),
        });
        if !allowed {
            return Err(ImageRefusal::NotAllowed(raw.to_owned()));
        }
        Ok(name)
    }
}

impl Default for ImagePatterns {
    /// The default sandbox image (`kiln-sandbox:latest`) only.
    fn default() -> Self {
        ImagePatterns { patterns: vec![Pattern::Exact("kiln-sandbox:latest".to_owned())] }
    }
}

fn familiar(name: &str) -> &str {
    HUB_PREFIXES.iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-/:@".contains(c)
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit())
}

fn is_reserved(repository: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| repository.starts_with(p))
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')))
}

/// Docker's tag grammar: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn is_tag(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Docker's repository grammar: an optional registry host (with a dot or
/// a port, or `localhost`) and lower-case path components separated by
/// `.`, `_`, `__` or dashes.
fn is_repository(s: &str) -> bool {
    let mut parts: Vec<&str> = s.split('/').collect();
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        if !is_host(host) {
            return false;
        }
    }
    s.len() <= 255 && parts.iter().all(|p| is_component(p))
}

fn is_host(s: &str) -> bool {
    let (name, port) = match s.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (s, None),
    };
    let name_ok = !name.is_empty()
        && name.split('.').all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    name_ok && port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()))
}

fn is_component(s: &str) -> bool {
    let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    if bytes.is_empty() || !lower_alnum(bytes[0] as char) || !lower_alnum(bytes[bytes.len() - 1] as char) {
        return false;
    }
    // Separators between runs of letters and digits: one `.`, one or two
    // `_`, or any number of `-`.
    let mut run = String::new();
    for c in s.chars() {
        if lower_alnum(c) {
            if !run.is_empty() && !matches!(run.as_str(), "." | "_" | "__") && !run.chars().all(|c| c == '-') {
                return false;
            }
            run.clear();
        } else if ".-_".contains(c) {
            run.push(c);
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_id_prefixes_and_kilns_own_names_are_refused_whatever_the_patterns() {
        let all = ImagePatterns::parse("*").unwrap();
        for id in ["ff5fc5", "FF5FC5", "sha256:ff5fc5", &format!("sha256:{}", "a".repeat(64)), &"b".repeat(64)] {
            assert!(matches!(all.check(id), Err(ImageRefusal::NotAName(_))), "{id}");
        }
        for own in ["kiln-env:abc", "kiln-env", "docker.io/library/kiln-env:x", "kiln-environment:1", "kiln-snapshot-1"]
        {
            assert!(matches!(all.check(own), Err(ImageRefusal::Reserved(_))), "{own}");
        }
        for bad in ["Node", "node:", "node@sha256:zz", "a//b", "-x", "node:tag/x", "ghcr.io:x/y"] {
            assert!(all.check(bad).is_err(), "{bad}");
        }
    }

    /// The document states the name rule as a pattern (`input::IMAGE`);
    /// the server parses. They must agree, or a client generated from the
    /// document is refused (and the OpenAPI fuzzer says so). (One
    /// difference is left: a name under `docker.io/[library/]` whose
    /// stripped first part holds a `.` but is no host name.)
    #[test]
    fn the_documents_pattern_and_the_parser_agree() {
        let digest = format!("@sha256:{}", "a".repeat(64));
        let mut names: Vec<String> = [
            "node",
            "node:20",
            "node:20-slim",
            "a.b",
            "a.b/c",
            "a_b/c",
            "a__b",
            "a___b",
            "a--b",
            "a-",
            "-a",
            "_a",
            "a.",
            "a..b",
            "A",
            "Node",
            "0",
            "ff5fc5",
            "ff5fc5:1",
            "FF5FC5",
            "abc/def",
            "abc/def:1",
            "cafe",
            "cafe-bar",
            "sha256:ff",
            "sha256:zz",
            "sha512:x",
            "kiln-env",
            "kiln-env:abc",
            "kiln-envx",
            "kiln-warm-1",
            "kiln-sandbox",
            "kiln-sandbox:latest",
            "kilnenv",
            "localhost/x",
            "localhost:5000/x",
            "localhost:5000",
            "host:5000/x:1",
            "a.b:5000/c",
            "a:1/b:2",
            "a_b.c/x",
            "a..b/x",
            "A.B/c",
            "ghcr.io/acme/build:1",
            "ghcr.io:x/y",
            "a//b",
            "a/",
            "/a",
            "a:b:c",
            "a/b:c/d",
            "node:",
            "node:tag/x",
            "node@sha256:zz",
            "docker.io/library/node",
            "docker.io/node:1",
            "docker.io/abc",
            "index.docker.io/library/kiln-env",
            "docker.io/library/ff",
            "x:_tag",
            "x:.tag",
            "x:-tag",
            "a:1@sha256:00",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        names.push(format!("node{digest}"));
        names.push(format!("abc{digest}"));
        names.push(format!("x:{}", "t".repeat(128)));
        names.push(format!("x:{}", "t".repeat(129)));
        for name in &names {
            assert_eq!(crate::input::IMAGE.accepts(name), ImageName::parse(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn patterns_match_canonical_names() {
        let rules = ImagePatterns::parse("kiln-sandbox:latest, node:*, ghcr.io/acme/*, python").unwrap();
        for ok in ["kiln-sandbox", "docker.io/library/node:20", "node:20-slim", "ghcr.io/acme/build:1", "python"] {
            assert!(rules.check(ok).is_ok(), "{ok}");
        }
        for no in ["python:3.12", "ubuntu:22.04", "ghcr.io/other/x:1", "kiln-sandbox:old", "nodejs:1"] {
            assert_eq!(rules.check(no), Err(ImageRefusal::NotAllowed(no.into())), "{no}");
        }
        let digest = format!("node@sha256:{}", "c".repeat(64));
        assert!(rules.check(&digest).is_err(), "a tag pattern does not cover digests");
        assert!(ImagePatterns::parse("node@*").unwrap().check(&digest).is_ok());
        assert_eq!(ImagePatterns::default().check("kiln-sandbox").unwrap().tagged().unwrap(), "kiln-sandbox:latest");
        assert_eq!(ImageName::parse("localhost:5000/a/b").unwrap().to_string(), "localhost:5000/a/b:latest");
        assert!(ImagePatterns::parse("ff5fc5").is_err() && ImagePatterns::parse("no*de").is_err());
    }
}
