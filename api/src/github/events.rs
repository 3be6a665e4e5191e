//! GitHub webhook payloads, and which of them ask Kiln for a run.
//!
//! Only the fields Kiln reads are declared; serde skips the rest. A payload
//! Kiln acts on but that lacks one of them is an error (400) naming the
//! field; anything Kiln does not act on is ignored with a reason, which
//! GitHub shows in the hook's delivery log.
//!
//! Who may ask:
//! - a comment (`issue_comment.created`, on an issue or a pull request) that
//!   starts with `/<handle>` or mentions `@<handle>` as a whole word (case
//!   does not matter; quoted lines, `> …`, are skipped so that quoting an old
//!   request does not repeat it), from an author whose association is OWNER,
//!   MEMBER or COLLABORATOR: people with write access;
//! - adding the trigger label to an issue (`issues.labeled`). GitHub sends no
//!   author association for the labeler, and adding a label takes only
//!   triage access.
//!
//! Neither says the person may push: an organisation MEMBER may have read
//! access only, and a triager can label. So the worker checks the sender's
//! permission on the repository through GitHub's API before it does any
//! work (`KILN_GITHUB_MIN_PERMISSION`, write by default); the checks here
//! only keep obvious strangers from queueing runs at all.
//!
//! Each run carries a trigger key naming the event from inside the signed
//! body (the comment's id; for a label, the issue, the label and the time
//! GitHub stamped on the issue), so a signed body replayed under a new
//! delivery id queues nothing.
//!
//! Bots never trigger a run: a sender or comment author whose account type
//! is `Bot` (GitHub Apps, Kiln's own App account `<handle>[bot]` included),
//! or whose login is the handle itself (Kiln running as a machine user), or
//! the login Kiln posts as when that is configured (`KILN_GITHUB_BOT_LOGIN`:
//! a token of a person or machine user, whose account is neither). So
//! Kiln's own comments, which may well mention `@<handle>`, start nothing,
//! and neither does another bot echoing a request.

use kiln_protocol::RepoSpec;
use kiln_store::GithubOrigin;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::GithubConfigError;
use super::command::{self, Command};
use super::prompt::{Request, Task};

/// Author associations that may ask for a run: those with write access.
const ALLOWED_ASSOCIATIONS: [&str; 3] = ["OWNER", "MEMBER", "COLLABORATOR"];
/// GitHub logins are at most 39 characters; App accounts add `[bot]`.
const MAX_LOGIN_BYTES: usize = 100;
/// Longest payload text echoed into a reason or a delivery row.
const MAX_ECHO_CHARS: usize = 200;
/// Longest error message sent back (serde quotes offending values).
const MAX_ERROR_CHARS: usize = 500;

/// Which comments and labels ask Kiln for a run.
#[derive(Debug, Clone)]
pub struct TriggerRules {
    /// The login people mention, lower-cased.
    handle: String,
    /// The issue label that asks for a run.
    label: String,
    /// The account Kiln's comments are posted as, lower-cased, when it is
    /// not the handle (a person's or machine user's token).
    poster: Option<String>,
}

impl TriggerRules {
    pub fn new(handle: &str, label: &str) -> Result<Self, GithubConfigError> {
        let handle = handle.strip_prefix('@').unwrap_or(handle);
        if !is_login(handle) {
            return Err(GithubConfigError::Handle(handle.to_owned()));
        }
        let label = label.trim();
        if label.is_empty() || label.chars().count() > 50 || label.chars().any(char::is_control) {
            return Err(GithubConfigError::Label(label.to_owned()));
        }
        Ok(TriggerRules { handle: handle.to_ascii_lowercase(), label: label.to_owned(), poster: None })
    }

    /// These rules, also ignoring comments by `login`: the account Kiln's
    /// token posts as (an App's `name[bot]` login is taken too).
    pub fn posting_as(self, login: &str) -> Result<Self, GithubConfigError> {
        let login = login.strip_prefix('@').unwrap_or(login);
        if !is_login(login.strip_suffix("[bot]").unwrap_or(login)) {
            return Err(GithubConfigError::BotLogin(login.to_owned()));
        }
        Ok(TriggerRules { poster: Some(login.to_ascii_lowercase()), ..self })
    }

    pub fn handle(&self) -> &str {
        &self.handle
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// True when `body` starts with `/<handle>` or mentions `@<handle>`
    /// outside a quoted line, as a whole word.
    pub fn addresses_kiln(&self, body: &str) -> bool {
        // ASCII lower-casing keeps byte offsets, so slicing stays valid.
        let text = body.to_ascii_lowercase();
        let command = format!("/{}", self.handle);
        if let Some(rest) = text.trim_start().strip_prefix(&command)
            && !rest.starts_with(is_word_char)
        {
            return true;
        }
        let mention = format!("@{}", self.handle);
        text.lines().filter(|line| !line.trim_start().starts_with('>')).any(|line| {
            line.match_indices(&mention).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = &line[at + mention.len()..];
                !before.is_some_and(is_word_char) && !after.starts_with(is_word_char)
            })
        })
    }

    /// True for bot accounts and for Kiln's own accounts.
    fn is_bot_or_kiln(&self, user: &User) -> bool {
        let login = user.login.to_ascii_lowercase();
        user.kind.eq_ignore_ascii_case("bot")
            || login == self.handle
            || login == format!("{}[bot]", self.handle)
            || self.poster.as_ref() == Some(&login)
    }
}

/// A GitHub login: 1 to 39 letters, digits and inner hyphens.
fn is_login(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 39
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// Characters that continue a login or word: `@kiln-bot` and `foo@kiln`
/// do not mention `kiln`.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

/// A payload that is not what its event promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PayloadError(String);

impl PayloadError {
    fn new(message: String) -> Self {
        PayloadError(message.chars().take(MAX_ERROR_CHARS).collect())
    }
}

/// A verified delivery's body: a JSON object.
#[derive(Debug)]
pub struct Payload {
    value: Value,
}

impl Payload {
    pub fn parse(body: &[u8]) -> Result<Self, PayloadError> {
        let text = std::str::from_utf8(body).map_err(|e| {
            PayloadError::new(format!("the body is not UTF-8 (bad byte at offset {})", e.valid_up_to()))
        })?;
        let value: Value =
            serde_json::from_str(text).map_err(|e| PayloadError::new(format!("the body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(PayloadError::new("the body must be a JSON object".into()));
        }
        Ok(Payload { value })
    }

    /// `action`, cleaned for a log row.
    pub fn action(&self) -> Option<String> {
        self.value.get("action").and_then(Value::as_str).map(echo)
    }

    /// `repository.full_name`, cleaned for a log row.
    pub fn repo(&self) -> Option<String> {
        self.value.pointer("/repository/full_name").and_then(Value::as_str).map(echo)
    }

    fn typed<T: DeserializeOwned>(&self, event: &str) -> Result<T, PayloadError> {
        T::deserialize(&self.value).map_err(|e| PayloadError::new(format!("`{event}` payload: {e}")))
    }
}

/// Payload text fit to repeat in a reason or a log row: no control
/// characters (Postgres refuses NUL), bounded length.
fn echo(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(MAX_ECHO_CHARS).collect()
}

/// What to do with a delivery.
#[derive(Debug)]
pub enum Decision {
    /// GitHub checking that the hook works.
    Ping,
    /// Nothing; the reason is sent back to GitHub.
    Ignore(String),
    /// Queue a run.
    Run(Box<RunRequest>),
    /// Choose an attempt of the issue's latest group (`/kiln select K`).
    Select(Box<SelectRequest>),
}

/// A `/kiln select K` comment: who asked, where, and which attempt.
#[derive(Debug)]
pub struct SelectRequest {
    pub origin: GithubOrigin,
    pub attempt: u32,
}

/// A run a delivery asks for, before it has a prompt.
#[derive(Debug)]
pub struct RunRequest {
    pub origin: GithubOrigin,
    pub repo: RepoSpec,
    pub task: Task,
    /// The event's identity from the signed body (see the module's docs).
    pub trigger_key: String,
    /// The attempts the comment asked for (`--attempts N`), as written:
    /// `None` when it did not ask (a label never does).
    pub attempts: Option<Result<u32, String>>,
}

/// Decides what delivery `event` (the `X-GitHub-Event` header) asks for.
pub fn decide(event: &str, payload: &Payload, rules: &TriggerRules) -> Result<Decision, PayloadError> {
    let action = payload.action();
    match (event, action.as_deref()) {
        ("ping", _) => Ok(Decision::Ping),
        ("issue_comment", Some("created")) => on_comment(payload.typed(event)?, rules),
        ("issues", Some("labeled")) => on_label(payload.typed(event)?, rules),
        ("issue_comment" | "issues", action) => Ok(Decision::Ignore(format!(
            "Kiln does not act on `{event}` events with action `{}`",
            action.unwrap_or("(none)")
        ))),
        _ => Ok(Decision::Ignore(format!("Kiln does not act on `{event}` events"))),
    }
}

fn on_comment(e: IssueCommentEvent, rules: &TriggerRules) -> Result<Decision, PayloadError> {
    if rules.is_bot_or_kiln(&e.sender) || rules.is_bot_or_kiln(&e.comment.user) {
        return Ok(Decision::Ignore("the comment is from a bot account; bots never trigger runs".into()));
    }
    if !rules.addresses_kiln(&e.comment.body) {
        let h = rules.handle();
        return Ok(Decision::Ignore(format!("the comment does not mention @{h} or start with /{h}")));
    }
    let association = e.comment.author_association.as_str();
    if !ALLOWED_ASSOCIATIONS.contains(&association) {
        return Ok(Decision::Ignore(format!(
            "the comment's author association is {}: not allowed to trigger runs (needs OWNER, MEMBER or COLLABORATOR)",
            echo(association)
        )));
    }
    let author = login("comment.user.login", &e.comment.user.login)?;
    let command = command::parse(&e.comment.body, rules.handle());
    let request = Request::Comment { author: author.clone(), body: e.comment.body };
    let trigger_key = format!("issue_comment:{}", e.comment.id);
    let origin = Origin { event: "issue_comment", sender_login: author, comment_id: Some(e.comment.id), trigger_key };
    let decision = run_request(origin, e.issue, e.repository, e.installation, request)?;
    Ok(match (decision, command) {
        (Decision::Run(run), Command::Select(attempt)) => {
            Decision::Select(Box::new(SelectRequest { origin: run.origin, attempt }))
        }
        (Decision::Run(mut run), Command::Run { attempts }) => {
            run.attempts = attempts;
            Decision::Run(run)
        }
        (other, _) => other,
    })
}

fn on_label(e: IssuesEvent, rules: &TriggerRules) -> Result<Decision, PayloadError> {
    let Some(label) = e.label else {
        return Ok(Decision::Ignore("the `labeled` event names no label".into()));
    };
    // GitHub treats label names case-insensitively (a repository cannot have both).
    if label.name.to_lowercase() != rules.label().to_lowercase() {
        return Ok(Decision::Ignore(format!(
            "label `{}` is not Kiln's trigger label `{}`",
            echo(&label.name),
            rules.label()
        )));
    }
    if rules.is_bot_or_kiln(&e.sender) {
        return Ok(Decision::Ignore("the label was added by a bot account; bots never trigger runs".into()));
    }
    let by = login("sender.login", &e.sender.login)?;
    // GitHub stamps the issue's `updated_at` afresh each time a label is
    // added: removing the label and adding it again is a new request, the
    // same body sent again is not.
    let Some(stamp) = e.issue.updated_at.as_deref() else {
        return Err(PayloadError::new("issue.updated_at is missing from a `labeled` event".into()));
    };
    let trigger_key = format!(
        "issues.labeled:{}#{}:{}:{}",
        echo(&e.repository.full_name),
        e.issue.number,
        echo(&label.name.to_lowercase()),
        echo(stamp)
    );
    let request = Request::Label { label: echo(&label.name), by: by.clone() };
    let origin = Origin { event: "issues", sender_login: by, comment_id: None, trigger_key };
    run_request(origin, e.issue, e.repository, e.installation, request)
}

/// What differs between the triggers in a run's origin.
struct Origin {
    event: &'static str,
    sender_login: String,
    comment_id: Option<i64>,
    trigger_key: String,
}

fn run_request(
    origin: Origin,
    issue: Issue,
    repository: Repository,
    installation: Option<Installation>,
    request: Request,
) -> Result<Decision, PayloadError> {
    let repo_full_name = repo_name(&repository.full_name)?;
    if issue.number <= 0 {
        return Err(PayloadError::new(format!("issue.number must be positive, not {}", issue.number)));
    }
    // A comment on a pull request arrives as a comment on an issue with a
    // `pull_request` link. The payload does not carry the PR's head branch:
    // the worker resolves it from the number, so no ref is chosen here.
    let is_pull_request = issue.pull_request.is_some();
    let git_ref = if is_pull_request { None } else { repository.default_branch };
    let repo = RepoSpec { url: clone_url(repository.clone_url)?, git_ref };
    let task = Task {
        repo_full_name: repo_full_name.clone(),
        number: issue.number,
        is_pull_request,
        title: issue.title,
        body: issue.body,
        request,
    };
    let github = GithubOrigin {
        event: origin.event.to_owned(),
        repo_full_name,
        issue_number: issue.number,
        pr_number: is_pull_request.then_some(issue.number),
        comment_id: origin.comment_id,
        installation_id: installation.map(|i| i.id),
        sender_login: origin.sender_login,
    };
    Ok(Decision::Run(Box::new(RunRequest {
        origin: github,
        repo,
        task,
        trigger_key: origin.trigger_key,
        attempts: None,
    })))
}

/// A login as Kiln stores and quotes it: printable ASCII, bounded.
fn login(field: &str, value: &str) -> Result<String, PayloadError> {
    if value.is_empty() || value.len() > MAX_LOGIN_BYTES || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(PayloadError::new(format!("{field} is not a GitHub login: {:?}", echo(value))));
    }
    Ok(value.to_owned())
}

/// GitHub (and GitHub Enterprise) clone over HTTP(S). Anything else, a
/// `file://` URL above all, would have the worker clone something that is
/// not the repository the delivery is about.
fn clone_url(url: String) -> Result<String, PayloadError> {
    if url.starts_with("https://") || url.starts_with("http://") {
        Ok(url)
    } else {
        Err(PayloadError::new(format!("repository.clone_url must be an http(s) URL, not {:?}", echo(&url))))
    }
}

/// `owner/name` as GitHub allows them: an owner of letters, digits,
/// hyphens and underscores (Enterprise managed users), a name of letters, digits, `.`, `_` and `-` (not `.` or `..`).
/// The worker puts it in API paths and the clone URL it builds, so nothing
/// else (`/`, `%`, `?`, `..`) may reach them.
fn repo_name(value: &str) -> Result<String, PayloadError> {
    if !is_full_name(value) {
        return Err(PayloadError::new(format!("repository.full_name is not owner/name: {:?}", echo(value))));
    }
    Ok(value.to_owned())
}

/// Whether `value` is a GitHub `owner/name`.
pub fn is_full_name(value: &str) -> bool {
    let Some((owner, name)) = value.split_once('/') else { return false };
    let part = |s: &str, extra: &[char]| {
        !s.is_empty() && s.len() <= 100 && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    part(owner, &['-', '_']) && part(name, &['.', '_', '-']) && name != "." && name != ".."
}

// ---------------------------------------------------------------------------
// Payload shapes (the fields Kiln reads)
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct IssueCommentEvent {
    issue: Issue,
    comment: Comment,
    repository: Repository,
    sender: User,
    #[serde(default)]
    installation: Option<Installation>,
}

#[derive(Debug, Deserialize)]
struct IssuesEvent {
    issue: Issue,
    #[serde(default)]
    label: Option<Label>,
    repository: Repository,
    sender: User,
    #[serde(default)]
    installation: Option<Installation>,
}

#[derive(Debug, Deserialize)]
struct Issue {
    number: i64,
    title: String,
    /// `null` when the issue has no description.
    #[serde(default)]
    body: Option<String>,
    /// Present when the issue is a pull request.
    #[serde(default)]
    pull_request: Option<IgnoredAny>,
    /// When GitHub last changed the issue (labelling it included).
    #[serde(default)]
    updated_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Comment {
    id: i64,
    body: String,
    user: User,
    author_association: String,
}

#[derive(Debug, Deserialize)]
struct User {
    login: String,
    /// `User`, `Bot` or `Organization`.
    #[serde(rename = "type", default)]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Repository {
    full_name: String,
    clone_url: String,
    #[serde(default)]
    default_branch: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Installation {
    id: i64,
}

#[derive(Debug, Deserialize)]
struct Label {
    name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> TriggerRules {
        TriggerRules::new("kiln", "kiln").unwrap()
    }

    fn fixture(name: &str) -> Value {
        let path = format!("{}/../tests/fixtures/github/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn decide_json(event: &str, value: &Value) -> Decision {
        let payload = Payload::parse(value.to_string().as_bytes()).unwrap();
        decide(event, &payload, &rules()).unwrap()
    }

    fn comment(body: &str, association: &str) -> Value {
        let mut v = fixture("issue_comment.created.json");
        v["comment"]["body"] = body.into();
        v["comment"]["author_association"] = association.into();
        v
    }

    fn ignored(d: Decision) -> String {
        match d {
            Decision::Ignore(reason) => reason,
            other => panic!("expected Ignore, got {other:?}"),
        }
    }

    fn run(d: Decision) -> RunRequest {
        match d {
            Decision::Run(r) => *r,
            other => panic!("expected Run, got {other:?}"),
        }
    }

    #[test]
    fn mentions_and_commands_are_whole_words() {
        let r = rules();
        for yes in [
            "@kiln please fix",
            "hey @Kiln, can you look?",
            "thanks\n@KILN fix it.",
            "/kiln fix the typo",
            "  /kiln",
            "(@kiln)",
            "cc @kiln[bot]",
        ] {
            assert!(r.addresses_kiln(yes), "{yes:?}");
        }
        for no in [
            "please fix",
            "mail me at ops@kiln.dev",
            "@kilnbot fix",
            "@kiln-bot fix",
            "@kiln_x",
            "/kilnx fix",
            "see /kiln in the middle",
            "> @kiln please fix\nagreed",
            "kiln please fix",
        ] {
            assert!(!r.addresses_kiln(no), "{no:?}");
        }
        let custom = TriggerRules::new("@My-Bot", "x").unwrap();
        assert!(custom.addresses_kiln("@my-bot go"));
        assert!(!custom.addresses_kiln("@kiln go"));
    }

    #[test]
    fn invalid_handles_and_labels_are_refused() {
        for bad in ["", "@", "-kiln", "kiln-", "kiln[bot]", "a b", &"k".repeat(40)] {
            assert!(TriggerRules::new(bad, "kiln").is_err(), "{bad:?}");
        }
        for bad in ["", "   ", "a\nb", &"l".repeat(51)] {
            assert!(TriggerRules::new("kiln", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn comments_by_the_account_kiln_posts_as_are_ignored() {
        let r = rules().posting_as("@Kiln-Ops").unwrap();
        let mut v = comment("@kiln please fix", "MEMBER");
        v["sender"]["login"] = "kiln-ops".into();
        v["comment"]["user"]["login"] = "KILN-OPS".into();
        let Decision::Ignore(why) = decide("issue_comment", &Payload { value: v.clone() }, &r).unwrap() else {
            panic!("Kiln's own comment asked for a run");
        };
        assert!(why.contains("bot"), "{why}");
        assert!(matches!(decide("issue_comment", &Payload { value: v }, &rules()).unwrap(), Decision::Run(_)));
        assert!(rules().posting_as("kiln-app[bot]").is_ok());
        for bad in ["", "a b", "-x", "x[bot][bot]"] {
            assert!(rules().posting_as(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_owner_comment_addressing_kiln_asks_for_a_run() {
        let r = run(decide_json("issue_comment", &comment("@kiln please fix", "OWNER")));
        assert_eq!(
            r.origin,
            GithubOrigin {
                event: "issue_comment".into(),
                repo_full_name: "Codertocat/Hello-World".into(),
                issue_number: 1,
                pr_number: None,
                comment_id: Some(492700400),
                installation_id: None,
                sender_login: "Codertocat".into(),
            }
        );
        assert_eq!(r.repo.url, "https://github.com/Codertocat/Hello-World.git");
        assert_eq!(r.repo.git_ref.as_deref(), Some("master"));
        assert_eq!(r.task.title, "Spelling error in the README file");
        assert!(matches!(r.task.request, Request::Comment { ref body, .. } if body == "@kiln please fix"));
    }

    #[test]
    fn members_and_collaborators_may_ask_others_may_not() {
        for ok in ["MEMBER", "COLLABORATOR"] {
            run(decide_json("issue_comment", &comment("/kiln go", ok)));
        }
        for no in ["CONTRIBUTOR", "FIRST_TIMER", "FIRST_TIME_CONTRIBUTOR", "MANNEQUIN", "NONE", "owner"] {
            let reason = ignored(decide_json("issue_comment", &comment("/kiln go", no)));
            assert!(reason.contains("not allowed to trigger"), "{reason}");
        }
    }

    #[test]
    fn bots_and_kiln_itself_never_trigger() {
        let mut app = comment("@kiln please fix", "OWNER");
        app["sender"]["type"] = "Bot".into();
        assert!(ignored(decide_json("issue_comment", &app)).contains("bot"));
        for own in ["kiln", "Kiln[bot]"] {
            let mut v = comment("@kiln please fix", "OWNER");
            v["sender"]["login"] = own.into();
            v["comment"]["user"]["login"] = own.into();
            assert!(ignored(decide_json("issue_comment", &v)).contains("bot"), "{own}");
        }
    }

    #[test]
    fn a_comment_on_a_pull_request_records_the_pr_and_leaves_the_ref_to_the_worker() {
        let mut v = fixture("issue_comment.created.with-installation.json");
        v["comment"]["body"] = "/kiln rebase this".into();
        v["issue"]["pull_request"] = serde_json::json!({"url": "https://api.github.com/repos/o/r/pulls/1"});
        let r = run(decide_json("issue_comment", &v));
        assert_eq!(r.origin.pr_number, Some(r.origin.issue_number));
        assert_eq!(r.origin.installation_id, Some(1));
        assert_eq!(r.repo.git_ref, None);
        assert!(r.task.is_pull_request);
    }

    #[test]
    fn the_trigger_label_asks_for_a_run_other_labels_do_not() {
        let mut v = fixture("issues.labeled.json");
        assert!(ignored(decide_json("issues", &v)).contains("`bug` is not Kiln's trigger label"));
        v["label"]["name"] = "Kiln".into();
        let r = run(decide_json("issues", &v));
        assert_eq!(r.origin.event, "issues");
        assert_eq!(r.origin.comment_id, None);
        assert!(matches!(r.task.request, Request::Label { ref by, .. } if by == "Codertocat"));
        v["sender"]["type"] = "Bot".into();
        assert!(ignored(decide_json("issues", &v)).contains("bot"));
    }

    #[test]
    fn other_events_and_actions_are_ignored_with_a_reason() {
        assert!(matches!(decide_json("ping", &fixture("ping.json")), Decision::Ping));
        let reason = ignored(decide_json("pull_request", &fixture("pull_request.opened.json")));
        assert_eq!(reason, "Kiln does not act on `pull_request` events");
        let reason = ignored(decide_json("issues", &fixture("issues.opened.json")));
        assert_eq!(reason, "Kiln does not act on `issues` events with action `opened`");
        let mut edited = comment("@kiln please fix", "OWNER");
        edited["action"] = "edited".into();
        assert!(ignored(decide_json("issue_comment", &edited)).contains("action `edited`"));
    }

    #[test]
    fn hostile_payloads_are_errors_that_say_why() {
        let err = |body: &[u8]| Payload::parse(body).unwrap_err().to_string();
        assert!(err(b"{\"action\":").contains("not valid JSON"));
        assert!(err(b"[1,2]").contains("JSON object"));
        assert!(err(b"{\"a\":\"\xff\"}").contains("not UTF-8"));

        let mut v = comment("@kiln fix", "OWNER");
        v.as_object_mut().unwrap().remove("comment");
        let payload = Payload::parse(v.to_string().as_bytes()).unwrap();
        let e = decide("issue_comment", &payload, &rules()).unwrap_err().to_string();
        assert!(e.contains("missing field `comment`"), "{e}");

        let mut v = comment("@kiln fix", "OWNER");
        v["repository"]["clone_url"] = "file:///etc".into();
        let payload = Payload::parse(v.to_string().as_bytes()).unwrap();
        assert!(decide("issue_comment", &payload, &rules()).unwrap_err().to_string().contains("http(s) URL"));

        let mut v = comment("@kiln fix", "OWNER");
        v["repository"]["full_name"] = "no-slash".into();
        let payload = Payload::parse(v.to_string().as_bytes()).unwrap();
        assert!(decide("issue_comment", &payload, &rules()).unwrap_err().to_string().contains("owner/name"));

        // Serde quotes offending values; the message stays short.
        let mut v = comment("@kiln fix", "OWNER");
        v["issue"]["number"] = "x".repeat(10_000).into();
        let payload = Payload::parse(v.to_string().as_bytes()).unwrap();
        assert!(decide("issue_comment", &payload, &rules()).unwrap_err().to_string().len() <= MAX_ERROR_CHARS * 4);
    }

    #[test]
    fn echoed_payload_text_is_clean_and_bounded() {
        let payload = Payload::parse(
            serde_json::json!({"action": "a\u{0}b", "repository": {"full_name": "x".repeat(1000)}})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(payload.action().as_deref(), Some("ab"));
        assert_eq!(payload.repo().map(|r| r.len()), Some(MAX_ECHO_CHARS));
    }
}
