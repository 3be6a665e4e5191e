//! Egress policy: where a sandbox's traffic may go through Kiln's proxy.
//!
//! A policy has a mode (`none`, `allowlist`, `open`) and, for `allowlist`,
//! host rules. The deployment has one (the operator's); a run may carry
//! another, which only narrows it: the proxy lets a request through only
//! when every layer allows it ([`Layers::check`]), so no run can widen what
//! the operator allows. Environments will carry one per phase; the type is
//! the same. Which *addresses* a name may resolve to (never loopback,
//! private, link-local, metadata) is decided by the proxy after resolving,
//! in every mode; this module only judges names, ports, methods and paths.
//! Pure: no I/O.

pub mod path;

use serde::{Deserialize, Serialize};

use crate::input;

/// The most rules one policy may carry; a policy is hostile input.
pub const MAX_RULES: usize = 256;
/// Ports a rule allows when it names none: plain HTTP and HTTPS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Common package registries and forges: what `@common` in the operator's
/// list (`KILN_EGRESS_ALLOW`) stands for. HTTPS only.
pub const PRESET_COMMON: &[&str] = &[
    // Python
    "pypi.org",
    "files.pythonhosted.org",
    // JavaScript
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    // Rust
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "static.rust-lang.org",
    // Go
    "proxy.golang.org",
    "sum.golang.org",
    // Ruby, Java
    "rubygems.org",
    "repo.maven.apache.org",
    "repo1.maven.org",
    // Debian and Ubuntu packages
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    // Forges
    "github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
    "raw.githubusercontent.com",
    "gitlab.com",
];

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// No network but loopback.
    #[default]
    None,
    /// Only hosts a rule allows, through the proxy.
    Allowlist,
    /// Any public address, through the proxy.
    Open,
}

impl EgressMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EgressMode::None => "none",
            EgressMode::Allowlist => "allowlist",
            EgressMode::Open => "open",
        }
    }
}

/// One layer of egress policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    #[serde(default)]
    pub mode: EgressMode,
    /// For `allowlist`: the hosts allowed. Absent in a run's policy: the
    /// run takes the deployment's list as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<HostRule>>,
}

/// Traffic to hosts matching `host` on one of `ports`; for plain HTTP,
/// optionally only some methods and paths. A rule with `methods` or
/// `path_prefixes` does not allow HTTPS (`CONNECT`), where the proxy cannot
/// see either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostRule {
    /// `example.com` (that name only) or `*.example.com` (any name under it,
    /// not the name itself). Case does not matter.
    pub host: String,
    /// Empty: 80 and 443.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Upper-case HTTP methods, e.g. `["GET", "HEAD"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Paths the request's must start with, each beginning with `/`, in
    /// normal form. The request's path is normalised before it is matched
    /// ([`path::normalize`]: dot segments removed, unreserved encodings
    /// decoded); a path servers could read in more than one way is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefixes: Option<Vec<String>>,
}

/// A request as the proxy sees it. `http` is `None` for a `CONNECT`
/// tunnel, whose method and path are encrypted.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub host: &'a str,
    pub port: u16,
    pub http: Option<(&'a str, &'a str)>,
}

/// Why a request was refused; `rule` says which rule, for the event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rule}")]
pub struct Denial {
    /// Which layer refused: `deployment` or `run`.
    pub layer: &'static str,
    pub rule: String,
}

impl HostRule {
    /// A rule for `host` on `ports`, nothing else narrowed.
    pub fn host(host: &str, ports: Vec<u16>) -> HostRule {
        HostRule { host: host.to_owned(), ports, methods: None, path_prefixes: None }
    }

    /// Parses the operator's short form, `host` or `host:port`.
    pub fn parse_short(s: &str) -> Result<HostRule, String> {
        let (host, ports) = match s.rsplit_once(':') {
            Some((h, p)) => (h, vec![p.parse::<u16>().map_err(|_| format!("{s:?}: bad port"))?]),
            None => (s, Vec::new()),
        };
        let rule = HostRule::host(host, ports);
        rule.validate()?;
        Ok(rule)
    }

    /// Checks the rule's shape: a host name pattern, sane methods and paths.
    pub fn validate(&self) -> Result<(), String> {
        // The rules the API document states (`crate::input`), not copies.
        if !input::EGRESS_HOST.accepts(&self.host) {
            return Err(format!("{:?} is not a host name or *.name pattern", self.host));
        }
        if let Some(port) = self.ports.iter().find(|p| !input::EGRESS_PORT.contains(**p)) {
            return Err(format!("{}: port {port}", self.host));
        }
        for m in self.methods.iter().flatten() {
            if !input::EGRESS_METHOD.accepts(m) {
                return Err(format!("{}: {m:?} is not an upper-case HTTP method", self.host));
            }
        }
        for p in self.path_prefixes.iter().flatten() {
            if !input::EGRESS_PATH_PREFIX.accepts(p) {
                return Err(format!("{}: path prefix {p:?} must start with /", self.host));
            }
            // A prefix no normal path starts with would never match.
            if path::normalize(p).as_deref() != Ok(p.as_str()) {
                return Err(format!(
                    "{}: path prefix {p:?} is not in normal form (dot segments, encodings)",
                    self.host
                ));
            }
        }
        Ok(())
    }

    fn matches_host(&self, host: &str) -> bool {
        let pattern = self.host.to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1 && host.ends_with(suffix) && {
                    let dot = host.len() - suffix.len() - 1;
                    host.as_bytes()[dot] == b'.'
                }
            }
            None => host == pattern,
        }
    }

    fn matches_port(&self, port: u16) -> bool {
        if self.ports.is_empty() { DEFAULT_PORTS.contains(&port) } else { self.ports.contains(&port) }
    }

    /// `None` when the rule lets `req` through; otherwise why not.
    fn refuses(&self, req: &Request<'_>) -> Option<String> {
        let restricted = self.methods.is_some() || self.path_prefixes.is_some();
        match req.http {
            None if restricted => Some(format!("{}: methods/paths are restricted, so no HTTPS tunnel", self.host)),
            None => None,
            Some((method, path)) => {
                if let Some(methods) = &self.methods
                    && !methods.iter().any(|m| m == method)
                {
                    return Some(format!("{}: methods {}", self.host, methods.join(",")));
                }
                let Some(prefixes) = &self.path_prefixes else { return None };
                match path::normalize(path) {
                    Err(why) => Some(format!("{}: path refused: {why}", self.host)),
                    Ok(normal) if !prefixes.iter().any(|p| normal.starts_with(p.as_str())) => {
                        Some(format!("{}: paths {}", self.host, prefixes.join(",")))
                    }
                    Ok(_) => None,
                }
            }
        }
    }
}

impl EgressPolicy {
    pub fn validate(&self) -> Result<(), String> {
        let rules = self.allow.as_deref().unwrap_or_default();
        if rules.len() > MAX_RULES {
            return Err(format!("at most {MAX_RULES} egress rules"));
        }
        rules.iter().try_for_each(HostRule::validate)
    }

    /// Whether this layer lets `req` through (names only; addresses are the
    /// proxy's to judge).
    fn check(&self, req: &Request<'_>) -> Result<(), String> {
        match self.mode {
            EgressMode::None => Err("mode none".into()),
            EgressMode::Open => Ok(()),
            EgressMode::Allowlist => {
                let Some(rules) = &self.allow else { return Ok(()) };
                let host = normalize_host(req.host);
                let mut refusal = None;
                for rule in rules.iter().filter(|r| r.matches_host(&host) && r.matches_port(req.port)) {
                    match rule.refuses(req) {
                        None => return Ok(()),
                        Some(why) => refusal = Some(why),
                    }
                }
                Err(refusal.unwrap_or_else(|| format!("allowlist: no rule for {host}:{}", req.port)))
            }
        }
    }
}

/// Lower-case, without a trailing dot: how names are compared.
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The deployment's policy and, optionally, the run's: a request passes
/// only if both let it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layers {
    pub deployment: EgressPolicy,
    pub run: Option<EgressPolicy>,
}

impl Layers {
    /// The mode in force: the narrower of the two.
    pub fn mode(&self) -> EgressMode {
        let run = self.run.as_ref().map_or(EgressMode::None, |r| r.mode);
        self.deployment.mode.min(run)
    }

    pub fn check(&self, req: &Request<'_>) -> Result<(), Denial> {
        self.deployment.check(req).map_err(|rule| Denial { layer: "deployment", rule })?;
        match &self.run {
            Some(run) => run.check(req).map_err(|rule| Denial { layer: "run", rule }),
            None => Err(Denial { layer: "run", rule: "mode none".into() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str) -> HostRule {
        HostRule::host(host, Vec::new())
    }

    fn allowlist(rules: Vec<HostRule>) -> EgressPolicy {
        EgressPolicy { mode: EgressMode::Allowlist, allow: Some(rules) }
    }

    fn tunnel(host: &str, port: u16) -> Request<'_> {
        Request { host, port, http: None }
    }

    #[test]
    fn host_patterns_match_names_and_subdomains() {
        let exact = rule("Example.com");
        assert!(exact.matches_host("example.com"));
        assert!(!exact.matches_host("www.example.com"));
        assert!(!exact.matches_host("badexample.com"));
        let wild = rule("*.example.com");
        assert!(wild.matches_host("a.example.com"));
        assert!(wild.matches_host("a.b.example.com"));
        assert!(!wild.matches_host("example.com"));
        assert!(!wild.matches_host("aexample.com"));
        assert!(!wild.matches_host("example.com.evil.net"));
    }

    #[test]
    fn a_run_narrows_the_deployment_and_never_widens_it() {
        let layers = Layers {
            deployment: allowlist(vec![rule("pypi.org"), rule("github.com")]),
            run: Some(allowlist(vec![rule("pypi.org"), rule("evil.example")])),
        };
        assert!(layers.check(&tunnel("pypi.org", 443)).is_ok());
        assert!(layers.check(&tunnel("PYPI.org.", 443)).is_ok());
        let d = layers.check(&tunnel("github.com", 443)).unwrap_err();
        assert_eq!(d.layer, "run");
        let d = layers.check(&tunnel("evil.example", 443)).unwrap_err();
        assert_eq!((d.layer, d.rule.as_str()), ("deployment", "allowlist: no rule for evil.example:443"));
        // A run asking for `open` gets the deployment's allowlist.
        let layers = Layers { run: Some(EgressPolicy { mode: EgressMode::Open, allow: None }), ..layers };
        assert_eq!(layers.mode(), EgressMode::Allowlist);
        assert!(layers.check(&tunnel("evil.example", 443)).is_err());
        assert!(layers.check(&tunnel("github.com", 443)).is_ok());
        // No run policy: none.
        let layers = Layers { run: None, ..layers };
        assert_eq!(layers.mode(), EgressMode::None);
        assert!(layers.check(&tunnel("github.com", 443)).is_err());
    }

    #[test]
    fn ports_default_to_http_and_https() {
        let layers = Layers { deployment: allowlist(vec![rule("a.test")]), run: Some(allowlist(vec![])) };
        // The run's empty list allows nothing.
        assert!(layers.check(&tunnel("a.test", 443)).is_err());
        let layers = Layers { run: Some(EgressPolicy { mode: EgressMode::Allowlist, allow: None }), ..layers };
        assert!(layers.check(&tunnel("a.test", 443)).is_ok());
        assert!(layers.check(&tunnel("a.test", 80)).is_ok());
        assert!(layers.check(&tunnel("a.test", 22)).is_err());
        let ssh = HostRule::parse_short("a.test:22").unwrap();
        assert_eq!(ssh.ports, [22]);
    }

    #[test]
    fn methods_and_paths_apply_to_plain_http_and_forbid_tunnels() {
        let read_only = HostRule {
            methods: Some(vec!["GET".into(), "HEAD".into()]),
            path_prefixes: Some(vec!["/simple/".into()]),
            ..rule("a.test")
        };
        let p = allowlist(vec![read_only]);
        let req = |method, path| Request { host: "a.test", port: 80, http: Some((method, path)) };
        assert!(p.check(&req("GET", "/simple/x")).is_ok());
        assert_eq!(p.check(&req("POST", "/simple/x")).unwrap_err(), "a.test: methods GET,HEAD");
        assert_eq!(p.check(&req("GET", "/upload")).unwrap_err(), "a.test: paths /simple/");
        assert!(p.check(&tunnel("a.test", 443)).is_err());
    }

    #[test]
    fn path_rules_judge_the_normalised_path_and_refuse_ambiguous_ones() {
        let p = allowlist(vec![HostRule { path_prefixes: Some(vec!["/simple/".into()]), ..rule("a.test") }]);
        let get = |path| p.check(&Request { host: "a.test", port: 80, http: Some(("GET", path)) });
        assert!(get("/simple/ok").is_ok());
        assert!(get("/%73imple/ok").is_ok());
        assert!(get("/x/../simple/ok").is_ok());
        assert_eq!(get("/simple/../admin").unwrap_err(), "a.test: paths /simple/");
        assert_eq!(get("/simple/./../admin").unwrap_err(), "a.test: paths /simple/");
        for ambiguous in ["/simple/%2e%2e/admin", "/simple/..%2fadmin", "/simple/%252e%252e/admin", "/simple/..;/admin"]
        {
            assert!(get(ambiguous).unwrap_err().starts_with("a.test: path refused: "), "{ambiguous}");
        }
        // Without path rules the path is not judged: an open deployment
        // passes what servers' own APIs use (GitLab's `%2F` in project ids).
        let open = allowlist(vec![rule("a.test")]);
        assert!(open.check(&Request { host: "a.test", port: 80, http: Some(("GET", "/p/a%2Fb")) }).is_ok());
        // Prefixes must be normal themselves.
        for bad in ["/simple/../", "/%73imple/", "/a/%2e/"] {
            let r = HostRule { path_prefixes: Some(vec![bad.into()]), ..rule("a.test") };
            assert!(r.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in ["", "*.", "a..b", "a b", "http://a", "a/b", "*", "a:0", "a:x", "a:70000"] {
            assert!(HostRule::parse_short(bad).is_err(), "{bad:?}");
        }
        let r = HostRule { methods: Some(vec!["get".into()]), ..rule("a") };
        assert!(r.validate().is_err());
        let r = HostRule { path_prefixes: Some(vec!["x".into()]), ..rule("a") };
        assert!(r.validate().is_err());
        let p = EgressPolicy { mode: EgressMode::Allowlist, allow: Some(vec![rule("a"); MAX_RULES + 1]) };
        assert!(p.validate().is_err());
        for name in PRESET_COMMON {
            assert!(HostRule::parse_short(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn a_policy_reads_from_json() {
        let p: EgressPolicy = serde_json::from_value(serde_json::json!({
            "mode": "allowlist",
            "allow": [{"host": "*.pypi.org", "ports": [443]}, {"host": "a.test", "methods": ["GET"]}]
        }))
        .unwrap();
        assert_eq!(p.allow.as_ref().map(Vec::len), Some(2));
        assert!(serde_json::from_value::<EgressPolicy>(serde_json::json!({"mode": "bridge"})).is_err());
    }
}
