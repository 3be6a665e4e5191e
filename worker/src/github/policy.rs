//! What a GitHub run may do, whatever its webhook says: whose requests are
//! worked on (the sender's permission on the repository, asked of GitHub),
//! where the token goes (the configured GitHub's URL for the repository,
//! never the payload's `clone_url`), and what lands there (drafts; nothing
//! under `.github/` unless allowed).

use super::GithubError;

/// How far a sender's access to the repository must reach for Kiln to work
/// on their request (`KILN_GITHUB_MIN_PERMISSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Write,
    Maintain,
    Admin,
}

impl Permission {
    pub fn parse(s: &str) -> Result<Self, GithubError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "write" => Ok(Permission::Write),
            "maintain" => Ok(Permission::Maintain),
            "admin" => Ok(Permission::Admin),
            other => Err(GithubError::Config(format!(
                "KILN_GITHUB_MIN_PERMISSION must be write, maintain or admin, not {other:?}"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Write => "write",
            Permission::Maintain => "maintain",
            Permission::Admin => "admin",
        }
    }

    fn rank(self) -> u8 {
        match self {
            Permission::Write => 3,
            Permission::Maintain => 4,
            Permission::Admin => 5,
        }
    }
}

/// Rank of a GitHub role or permission name; 0 for none and for custom
/// roles (whose base shows in `permission` instead).
fn rank_of(name: &str) -> u8 {
    match name {
        "read" | "pull" => 1,
        "triage" => 2,
        "write" | "push" => 3,
        "maintain" => 4,
        "admin" => 5,
        _ => 0,
    }
}

/// Whether a sender whose collaborator permission GitHub reports as
/// `permission` (`admin`, `write`, `read`, `none`: maintain folded into
/// write, triage into read) and `role_name` (the finer role, or a custom
/// role's name) reaches `min`.
pub fn allows(min: Permission, permission: &str, role_name: Option<&str>) -> bool {
    let have = rank_of(permission).max(role_name.map_or(0, rank_of));
    have >= min.rank()
}

/// What delivery may do on GitHub; see the settings of the same names.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryPolicy {
    /// The least access a sender needs for their request to be worked on.
    pub min_permission: Permission,
    /// Open pull requests as drafts.
    pub draft_pull_requests: bool,
    /// Push changes under `.github/` (workflows run with the repository's
    /// secrets) rather than refusing them.
    pub allow_workflow_changes: bool,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        DeliveryPolicy { min_permission: Permission::Write, draft_pull_requests: true, allow_workflow_changes: false }
    }
}

/// Whether `value` is a GitHub `owner/name`: what the API and the clone URL
/// are built from, so no `/`, `%`, `?` or `..` beyond the one separator.
pub fn check_full_name(value: &str) -> Result<(), GithubError> {
    let part = |s: &str, extra: &[char]| {
        !s.is_empty() && s.len() <= 100 && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    let ok = value.split_once('/').is_some_and(|(owner, name)| {
        part(owner, &['-', '_']) && part(name, &['.', '_', '-']) && name != "." && name != ".."
    });
    if !ok {
        return Err(GithubError::Delivery(format!("{value:?} is not a GitHub repository name (owner/name)")));
    }
    Ok(())
}

/// Whether `login` is a GitHub login, fit for an API path.
pub fn check_login(login: &str) -> Result<(), GithubError> {
    let ok = !login.is_empty()
        && login.len() <= 100
        && login.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        return Err(GithubError::Delivery(format!("{login:?} is not a GitHub login")));
    }
    Ok(())
}

/// The URL git reaches `full_name` at on the configured GitHub.
pub fn clone_url(web_url: &str, full_name: &str) -> String {
    format!("{}/{full_name}.git", web_url.trim_end_matches('/'))
}

/// The repository's URL on the configured GitHub, after checking that the
/// run's (the webhook's `clone_url`) names the same: the token goes to the
/// configured host only, never to a host a payload names.
pub fn repository_url(web_url: &str, full_name: &str, from_webhook: &str) -> Result<String, GithubError> {
    check_full_name(full_name)?;
    let url = clone_url(web_url, full_name);
    if !from_webhook.trim_end_matches('/').eq_ignore_ascii_case(&url) {
        return Err(GithubError::Delivery(format!(
            "the webhook's clone URL {from_webhook:?} is not {url}, where the configured GitHub serves {full_name}; \
             Kiln sends its token nowhere else (KILN_GITHUB_WEB_URL)"
        )));
    }
    Ok(url)
}

/// The web (and git) base of the GitHub whose REST API is at `api_url`:
/// `https://api.github.com` → `https://github.com`, a GitHub Enterprise
/// `https://HOST/api/v3` → `https://HOST`; anything else is taken to serve
/// both (a proxy, a test double).
pub fn web_url_for(api_url: &str) -> String {
    let api = api_url.trim_end_matches('/');
    if api.eq_ignore_ascii_case("https://api.github.com") {
        return "https://github.com".into();
    }
    api.strip_suffix("/api/v3").unwrap_or(api).to_owned()
}

/// The changed paths (`git diff --name-only -z` output) under `.github/`,
/// whose workflows run with the repository's secrets. Compared without case:
/// a checkout on a case-insensitive disk would take `.GitHub/` for it.
pub fn workflow_paths(changed: &str) -> Vec<String> {
    changed
        .split('\0')
        .filter(|p| p.split('/').next().is_some_and(|top| top.eq_ignore_ascii_case(".github")))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_below_the_minimum_are_refused() {
        assert!(allows(Permission::Write, "write", Some("write")));
        assert!(allows(Permission::Write, "admin", Some("admin")));
        assert!(allows(Permission::Write, "write", Some("custom-dev")));
        assert!(!allows(Permission::Write, "read", Some("triage")));
        assert!(!allows(Permission::Write, "read", Some("read")));
        assert!(!allows(Permission::Write, "none", None));
        assert!(allows(Permission::Maintain, "write", Some("maintain")));
        assert!(!allows(Permission::Maintain, "write", Some("write")));
        assert!(!allows(Permission::Admin, "write", Some("maintain")));
        assert!(Permission::parse("Maintain").is_ok());
        assert!(Permission::parse("read").is_err());
    }

    #[test]
    fn the_token_goes_to_the_configured_host_only() {
        let web = "https://github.com";
        assert_eq!(repository_url(web, "o/r", "https://github.com/o/r.git").unwrap(), "https://github.com/o/r.git");
        assert!(repository_url(web, "O/R", "https://github.com/o/r.git").is_ok());
        assert!(repository_url(web, "o/r", "https://elsewhere/o/r.git").is_err());
        assert!(repository_url(web, "o/r/../x", "https://github.com/o/r/../x.git").is_err());
        assert!(repository_url(web, "o/%2e%2e", "https://github.com/o/%2e%2e.git").is_err());
        assert_eq!(web_url_for("https://api.github.com/"), "https://github.com");
        assert_eq!(web_url_for("https://ghe.example/api/v3"), "https://ghe.example");
        assert_eq!(web_url_for("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }

    #[test]
    fn changes_under_dot_github_are_found() {
        let changed = "README.md\0.github/workflows/x.yml\0.GitHub/CODEOWNERS\0docs/.github/y\0";
        assert_eq!(workflow_paths(changed), [".github/workflows/x.yml", ".GitHub/CODEOWNERS"]);
        assert!(workflow_paths("").is_empty());
    }
}
