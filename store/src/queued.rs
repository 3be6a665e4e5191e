//! A queued run: the one definition of the row a run is queued as and of its
//! `run.queued` event, whatever queued it (a client, a GitHub mention, a
//! message to a finished run or one its end left unread).

use kiln_protocol::{CreateRun, EventBody, RepoSpec, Trigger};
use uuid::Uuid;

use crate::StoreError;

/// What the API hands the store to create a run.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub owner: String,
    pub spec: CreateRun,
    pub trigger: Trigger,
    pub idempotency_key: Option<String>,
}

/// A run about to be queued.
pub(crate) struct QueuedRun<'a> {
    pub owner: &'a str,
    pub prompt: &'a str,
    /// The run's settings as stored: `ModelSpec`, `Limits` and `Policy` as
    /// JSON, so a follow-up takes its source's exactly as they are.
    pub model: serde_json::Value,
    pub limits: serde_json::Value,
    pub policy: serde_json::Value,
    pub callback_url: Option<&'a str>,
    pub trigger: Trigger,
    pub idempotency_key: Option<&'a str>,
    pub session: Session<'a>,
}

/// The session a queued run belongs to.
pub(crate) enum Session<'a> {
    /// A first run: its session, on this repository, is made with it.
    New { repo: Option<&'a RepoSpec> },
    /// A follow-up: the session of the run it follows.
    Existing(Uuid),
}

impl<'a> QueuedRun<'a> {
    /// A run as a client (or GitHub) asked for it, in a session of its own.
    pub(crate) fn first(new: &'a NewRun) -> Result<Self, StoreError> {
        let json =
            |value: Result<serde_json::Value, serde_json::Error>| value.map_err(|e| StoreError::Corrupt(e.to_string()));
        Ok(QueuedRun {
            owner: &new.owner,
            prompt: &new.spec.prompt,
            model: json(serde_json::to_value(new.spec.model.clone().unwrap_or_default()))?,
            limits: json(serde_json::to_value(new.spec.limits.unwrap_or_default()))?,
            policy: json(serde_json::to_value(new.spec.policy()))?,
            callback_url: new.spec.callback_url.as_deref(),
            trigger: new.trigger,
            idempotency_key: new.idempotency_key.as_deref(),
            session: Session::New { repo: new.spec.repo.as_ref() },
        })
    }
}

/// The insert of a queued run and its `run.queued` event (seq 1), in the
/// session `session` (a CTE answering its `id`): `$1` run id, `$2` session
/// id, `$3` owner, `$4` prompt, `$5` model, `$6` limits, `$7` trigger, `$8`
/// idempotency key, `$9` policy, `$10` callback URL, `$11` kind and `$12`
/// payload of the event. Answers the run's id; no row when the idempotency
/// key is already taken.
fn insert_statement(session: &str) -> String {
    format!(
        "WITH s AS (
             {session}
         ), r AS (
             INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, trigger, idempotency_key,
                               policy, callback_url, last_event_seq)
             SELECT $1, s.id, $3, 'queued', $4, $5, $6, $7, $8, $9, $10, 1 FROM s
             ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
             RETURNING id
         ), e AS (
             INSERT INTO events (run_id, seq, kind, payload) SELECT id, 1, $11, $12 FROM r
         )
         SELECT id FROM r"
    )
}

/// A first run: its session (`$13` repo URL, `$14` ref) in the same statement.
static IN_NEW_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    insert_statement("INSERT INTO sessions (id, owner, repo_url, repo_ref) VALUES ($2, $3, $13, $14) RETURNING id")
});

/// A follow-up, in the session `$2`.
static IN_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| insert_statement("SELECT $2::uuid AS id"));

/// First runs admitted together under their subjects' quotas
/// (`admission`), in one autocommitted statement that takes each counted
/// subject's lock (`kiln_quota_check`, migrations/V29), counts, inserts as
/// many of each subject's candidates as fit in their order and answers them
/// as inserted: a lock is held for that one statement and its commit. `$1`
/// to `$14` are one array per column of the candidates, their owners first
/// ([`CandidateColumns`]), `$15` and `$16` the quota's limits
/// ([`QuotaLimits::counted`]). The runs come before their sessions so that
/// a run lost to an idempotency key leaves no session behind (the foreign
/// key is checked at the statement's end). Answers one row per candidate:
/// the run's [`RUN_COLUMNS`](crate::rows::RUN_COLUMNS), all null when
/// refused or when its key was taken, then the counts the check saw for its
/// subject, the candidate's place in the statement (from 1), whether the
/// quota admitted it and its place among its subject's candidates (from 1).
/// A single run has no attempts.
pub(crate) static ADMIT_TOGETHER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    // `LIMIT 1`: the function is planned as answering 1,000 rows (a set
    // function's default), which the join with the candidates makes a plan
    // costly enough for Postgres to compile it with JIT on every execution
    // (about half a second here); it answers one row. The subjects are
    // checked in the order of their locks' keys, so that two statements
    // that count the same subjects never each hold a lock the other waits
    // for (`admission` sends a counted subject's candidates alone; only
    // unlimited ones, which take no lock, share a statement). A limit that
    // is NULL is no limit: `LEAST` ignores it, and with both NULL every
    // candidate is admitted.
    "WITH b AS (
         SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[], $5::jsonb[], $6::jsonb[], $7::text[],
                              $8::text[], $9::jsonb[], $10::text[], $11::text[], $12::jsonb[], $13::text[], $14::text[])
             WITH ORDINALITY AS b(owner, id, session_id, prompt, model, limits, trigger, idempotency_key, policy,
                                  callback_url, kind, payload, repo_url, repo_ref, n)
     ), q AS (
         SELECT s.owner, c.* FROM (
             SELECT DISTINCT owner, hashtextextended(owner, 7) AS lock_key FROM b ORDER BY lock_key, owner
         ) s CROSS JOIN LATERAL (SELECT * FROM kiln_quota_check(s.owner, $15, $16) LIMIT 1) c
     ), a AS (
         SELECT ranked.*, coalesce(ranked.k <= LEAST($15 - q.active_runs, $16 - q.recent_runs), true) AS admitted
         FROM (SELECT b.*, row_number() OVER (PARTITION BY b.owner ORDER BY b.n) AS k FROM b) ranked
         JOIN q ON q.owner = ranked.owner
     ), r AS (
         INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, trigger, idempotency_key,
                           policy, callback_url, last_event_seq)
         SELECT id, session_id, owner, 'queued', prompt, model, limits, trigger, idempotency_key, policy,
                callback_url, 1
         FROM a WHERE admitted
         ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING *
     ), s AS (
         INSERT INTO sessions (id, owner, repo_url, repo_ref)
         SELECT a.session_id, a.owner, a.repo_url, a.repo_ref FROM a JOIN r ON r.id = a.id
     ), e AS (
         INSERT INTO events (run_id, seq, kind, payload) SELECT a.id, 1, a.kind, a.payload FROM a JOIN r ON r.id = a.id
     )
     SELECT r.id, r.session_id, r.status, r.prompt, a.repo_url, a.repo_ref,
            r.model, r.limits, r.trigger, r.attempt, r.cancel_requested, r.created_at, r.started_at,
            r.finished_at, r.result, r.error, r.last_event_seq, r.policy, r.callback_url, r.parent_run_id,
            r.agent_path, r.group_run_id, r.attempt_number, r.selected_attempt, NULL::uuid[],
            q.active_runs, q.recent_runs, q.retry_after_s, a.n, a.admitted, a.k
     FROM a JOIN q ON q.owner = a.owner LEFT JOIN r ON r.id = a.id"
        .to_owned()
});

/// Where the quota's counts start in a row of [`ADMIT_TOGETHER`]: after
/// the run's columns (then the candidate's place, whether it was admitted
/// and its place among its subject's candidates).
pub(crate) const ADMISSION_COUNTS_AT: usize = 25;

/// The quota's limits (`runs::Quota`'s, passed apart so that this module
/// and `runs` do not import each other).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaLimits {
    pub max_active_runs: i64,
    pub max_runs_per_minute: i64,
}

impl QuotaLimits {
    pub(crate) const UNLIMITED: i64 = i64::MAX;

    /// The limits as `kiln_quota_check` takes them (migrations/V29): each
    /// counted up to itself, an unlimited one (`None`) not at all.
    pub(crate) fn counted(self) -> [Option<i64>; 2] {
        [self.max_active_runs, self.max_runs_per_minute].map(|limit| (limit != Self::UNLIMITED).then_some(limit))
    }
}

/// A subject's runs as the quota check counted them.
pub(crate) struct QuotaCounts {
    pub active: i64,
    pub recent: i64,
    /// Seconds until the oldest run of the last minute leaves it.
    pub retry_after_s: Option<f64>,
}

impl QuotaCounts {
    /// From `kiln_quota_check`'s three columns, starting at column `at`.
    pub(crate) fn from_row(row: &tokio_postgres::Row, at: usize) -> Result<Self, StoreError> {
        Ok(QuotaCounts { active: row.try_get(at)?, recent: row.try_get(at + 1)?, retry_after_s: row.try_get(at + 2)? })
    }
}

/// A first run waiting for its subject's quota (`admission`): what its
/// insert binds, owned, its ids chosen.
pub(crate) struct Candidate {
    owner: String,
    run_id: Uuid,
    session_id: Uuid,
    prompt: String,
    model: serde_json::Value,
    limits: serde_json::Value,
    trigger: &'static str,
    idempotency_key: Option<String>,
    policy: serde_json::Value,
    callback_url: Option<String>,
    kind: String,
    payload: serde_json::Value,
    repo_url: Option<String>,
    repo_ref: Option<String>,
}

impl Candidate {
    /// The subject the run is for.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// `run`, a first run (a follow-up is admitted in its own transaction),
    /// taken whole so that its JSON settings move rather than copy.
    pub(crate) fn of(run: QueuedRun<'_>) -> Result<Self, StoreError> {
        if !matches!(run.session, Session::New { .. }) {
            return Err(StoreError::Corrupt("a follow-up is admitted in its own transaction".into()));
        }
        let values = InsertValues::of(&run)?;
        let (run_id, session_id, trigger) = (values.run_id, values.session_id, values.trigger);
        let (kind, payload) = (values.kind, values.payload);
        let repo_url = values.repo_url.map(str::to_owned);
        let repo_ref = values.repo_ref.map(str::to_owned);
        Ok(Candidate {
            owner: run.owner.to_owned(),
            run_id,
            session_id,
            prompt: run.prompt.to_owned(),
            model: run.model,
            limits: run.limits,
            trigger,
            idempotency_key: run.idempotency_key.map(str::to_owned),
            policy: run.policy,
            callback_url: run.callback_url.map(str::to_owned),
            kind,
            payload,
            repo_url,
            repo_ref,
        })
    }
}

/// Candidates as [`ADMIT_TOGETHER`]'s arrays, `$1` to `$14`.
pub(crate) struct CandidateColumns<'a> {
    owners: Vec<&'a str>,
    run_ids: Vec<Uuid>,
    session_ids: Vec<Uuid>,
    prompts: Vec<&'a str>,
    models: Vec<&'a serde_json::Value>,
    limits: Vec<&'a serde_json::Value>,
    triggers: Vec<&'static str>,
    idempotency_keys: Vec<Option<&'a str>>,
    policies: Vec<&'a serde_json::Value>,
    callback_urls: Vec<Option<&'a str>>,
    kinds: Vec<&'a str>,
    payloads: Vec<&'a serde_json::Value>,
    repo_urls: Vec<Option<&'a str>>,
    repo_refs: Vec<Option<&'a str>>,
}

impl<'a> CandidateColumns<'a> {
    pub(crate) fn of(candidates: &[&'a Candidate]) -> Self {
        let each = candidates.iter().copied();
        CandidateColumns {
            owners: each.clone().map(|c| c.owner.as_str()).collect(),
            run_ids: each.clone().map(|c| c.run_id).collect(),
            session_ids: each.clone().map(|c| c.session_id).collect(),
            prompts: each.clone().map(|c| c.prompt.as_str()).collect(),
            models: each.clone().map(|c| &c.model).collect(),
            limits: each.clone().map(|c| &c.limits).collect(),
            triggers: each.clone().map(|c| c.trigger).collect(),
            idempotency_keys: each.clone().map(|c| c.idempotency_key.as_deref()).collect(),
            policies: each.clone().map(|c| &c.policy).collect(),
            callback_urls: each.clone().map(|c| c.callback_url.as_deref()).collect(),
            kinds: each.clone().map(|c| c.kind.as_str()).collect(),
            payloads: each.clone().map(|c| &c.payload).collect(),
            repo_urls: each.clone().map(|c| c.repo_url.as_deref()).collect(),
            repo_refs: each.map(|c| c.repo_ref.as_deref()).collect(),
        }
    }

    pub(crate) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 14] {
        [
            &self.owners,
            &self.run_ids,
            &self.session_ids,
            &self.prompts,
            &self.models,
            &self.limits,
            &self.triggers,
            &self.idempotency_keys,
            &self.policies,
            &self.callback_urls,
            &self.kinds,
            &self.payloads,
            &self.repo_urls,
            &self.repo_refs,
        ]
    }
}

/// The values a queued run's insert binds, `$1` to `$14` of
/// [`insert_statement`] (and, owned, of a [`Candidate`]).
struct InsertValues<'a> {
    run: &'a QueuedRun<'a>,
    run_id: Uuid,
    session_id: Uuid,
    trigger: &'static str,
    kind: String,
    payload: serde_json::Value,
    repo_url: Option<&'a str>,
    repo_ref: Option<&'a str>,
}

impl<'a> InsertValues<'a> {
    fn of(run: &'a QueuedRun<'a>) -> Result<Self, StoreError> {
        let (kind, payload) = run_queued_event(run)?;
        let (session_id, repo) = match &run.session {
            Session::New { repo } => (Uuid::now_v7(), *repo),
            Session::Existing(id) => (*id, None),
        };
        Ok(InsertValues {
            run,
            run_id: Uuid::now_v7(),
            session_id,
            trigger: run.trigger.as_str(),
            kind,
            payload,
            repo_url: repo.map(|r| r.url.as_str()),
            repo_ref: repo.and_then(|r| r.git_ref.as_deref()),
        })
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 14] {
        [
            &self.run_id,
            &self.session_id,
            &self.run.owner,
            &self.run.prompt,
            &self.run.model,
            &self.run.limits,
            &self.trigger,
            &self.run.idempotency_key,
            &self.run.policy,
            &self.run.callback_url,
            &self.kind,
            &self.payload,
            &self.repo_url,
            &self.repo_ref,
        ]
    }
}

/// The `run.queued` event of `run`, as stored.
fn run_queued_event(run: &QueuedRun<'_>) -> Result<(String, serde_json::Value), StoreError> {
    EventBody::RunQueued { prompt: run.prompt.to_owned() }.into_parts().map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Inserts `run` (and its session, when new) with its `run.queued` event
/// inside the caller's transaction, in one statement. `None` when the
/// idempotency key is already taken (a new session is inserted anyway: the
/// caller rolls back). Notifies nobody: the caller announces the run after
/// its commit (`Store::announce_queued`).
pub(crate) async fn insert_queued_run_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    run: &QueuedRun<'_>,
) -> Result<Option<Uuid>, StoreError> {
    let values = InsertValues::of(run)?;
    let params = values.params();
    let (statement, used) = match &run.session {
        Session::New { .. } => (IN_NEW_SESSION.as_str(), params.len()),
        // The session's repository is already stored: `$13` and `$14` are
        // not in the statement.
        Session::Existing(_) => (IN_SESSION.as_str(), 12),
    };
    let insert = tx.prepare_cached(statement).await?;
    let inserted = tx.query_opt(&insert, &params[..used]).await?;
    Ok(inserted.map(|_| values.run_id))
}

/// [`ADMIT_TOGETHER`]'s SQL, for the test that checks how Postgres plans it.
pub fn admission_statement() -> String {
    ADMIT_TOGETHER.clone()
}
