//! Submissions under way at once are admitted together
//! (`store/src/admission.rs`): one subject's, when its quota is counted, in
//! one statement, one count and one commit for those that wait while the
//! subject's lock is held, each admitted in its turn, and a bad one failing
//! only itself; with no quota, every subject's together.
//!
//! Most tests here hold the subject's quota lock (`kiln_quota_check`'s
//! advisory lock, migrations/V27 and V29) from a connection of its own
//! while the submissions arrive, so that they all wait, then let it go.
//! Others check what the quota check costs (what it reads, and that it
//! takes no lock when there is nothing to count), and how a statement of
//! several subjects counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use kiln_tests::{Options, TestApp, token};
use reqwest::Response;
use serde_json::json;

const SENT: usize = 20;

async fn limited(quota: kiln_store::Quota) -> TestApp {
    let api = kiln_api::ApiSettings { quota, ..Default::default() };
    TestApp::spawn(Options { worker: false, api, ..Default::default() }).await
}

async fn submit(app: &TestApp, sub: &str, prompt: &str) -> Response {
    app.http.post(app.url("/v1/runs")).bearer_auth(token(sub)).json(&json!({"prompt": prompt})).send().await.unwrap()
}

/// A connection holding `subject`'s quota lock until [`Held::release`].
struct Held(tokio_postgres::Client, String);

impl Held {
    async fn take(app: &TestApp, subject: &str) -> Held {
        let client = app.sql().await;
        client.execute("SELECT pg_advisory_lock(hashtextextended($1, 7))", &[&subject]).await.unwrap();
        Held(client, subject.to_owned())
    }

    /// Waits until `n` statements of this database wait for an advisory
    /// lock (the subject's, as nothing else here takes one).
    async fn until_waiting(&self, n: i64) {
        until_waiting_for(&self.0, "advisory", n).await;
    }

    async fn release(self) {
        self.0.execute("SELECT pg_advisory_unlock(hashtextextended($1, 7))", &[&self.1]).await.unwrap();
    }
}

/// Waits until `n` statements of this database wait for a lock of
/// `locktype` (`pg_locks`).
async fn until_waiting_for(sql: &tokio_postgres::Client, locktype: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                 WHERE d.datname = current_database() AND l.locktype = $1 AND NOT l.granted",
                &[&locktype],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{waiting} statements waiting for a lock ({locktype}), not {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `SENT` submissions of `subject` while its lock is held, and answers
/// their statuses once it is let go. The first submissions' statements wait
/// for the lock in the database; the rest arrive while they wait.
async fn submit_while_locked(app: &TestApp, subject: &str, prompts: Vec<String>) -> Vec<Response> {
    let held = Held::take(app, subject).await;
    let prompts_sent = prompts.len();
    let sent = send(app, subject, prompts);
    held.until_waiting(1).await;
    until_in_admission(app, prompts_sent).await;
    held.release().await;
    let answers = sent.await.unwrap();
    assert_eq!(app.store.submissions_in_admission(), 0, "every submission answered leaves the count");
    answers
}

/// Sends `subject`'s submissions of `prompts` at once, in a task of their
/// own: its handle answers their responses, in order.
fn send(app: &TestApp, subject: &str, prompts: Vec<String>) -> tokio::task::JoinHandle<Vec<Response>> {
    let (http, url, token) = (app.http.clone(), app.url("/v1/runs"), token(subject));
    tokio::spawn(async move {
        let each = prompts.iter().map(|p| http.post(&url).bearer_auth(&token).json(&json!({"prompt": p})).send());
        join_all(each).await.into_iter().map(Result::unwrap).collect()
    })
}

fn statuses(answers: &[Response]) -> Vec<u16> {
    answers.iter().map(|r| r.status().as_u16()).collect()
}

/// Waits until the API is admitting exactly `n` submissions (each in its
/// line or a statement waiting for the lock): all those sent, so that none
/// arrives after the lock is let go, or those left once some went away.
async fn until_in_admission(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.store.submissions_in_admission() != n {
        let under_way = app.store.submissions_in_admission();
        assert!(Instant::now() < deadline, "{under_way} submissions in admission, not {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Transactions that inserted the subject's runs.
async fn commits_of_runs(app: &TestApp, owner: &str) -> i64 {
    app.sql()
        .await
        .query_one("SELECT count(DISTINCT xmin::text) FROM runs WHERE owner = $1", &[&owner])
        .await
        .unwrap()
        .get(0)
}

/// Twenty submissions waiting on one subject go in a few statements, not
/// one commit each; the quota still admits exactly its limit, in order, and
/// the rest are refused with the limit they hit.
#[tokio::test]
async fn a_subjects_waiting_submissions_share_a_statement_and_its_commit() {
    const LIMIT: i64 = 12;
    let app = limited(kiln_store::Quota { max_active_runs: LIMIT, max_runs_per_minute: 1000 }).await;
    let prompts = (0..SENT).map(|i| format!("task {i}")).collect();
    let answers = submit_while_locked(&app, "alice", prompts).await;
    let statuses = statuses(&answers);
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), LIMIT as usize, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), SENT - LIMIT as usize, "{statuses:?}");
    for refused in answers.into_iter().filter(|r| r.status() == 429) {
        assert!(refused.headers().get("retry-after").is_some());
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("active runs"), "{body}");
    }
    let sql = app.sql().await;
    let counts = sql
        .query_one(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM sessions),
                    (SELECT count(*) FROM events WHERE seq = 1 AND kind = 'run.queued')",
            &[],
        )
        .await
        .unwrap();
    let counts: (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    assert_eq!(counts, (LIMIT, LIMIT, LIMIT), "runs, sessions and queued events of the admitted only");
    // Two statements waited for the lock (one each of the two a subject
    // may have under way); the others went together once it was let go.
    let commits = commits_of_runs(&app, "alice").await;
    assert!(commits <= 4, "{LIMIT} runs admitted in {commits} commits");
}

/// The per-minute limit, counted the same way: the runs admitted before a
/// refused one in its own statement count against it, and it is told to
/// come back when the minute has passed.
#[tokio::test]
async fn a_statement_of_submissions_counts_its_own_runs_against_the_minute() {
    const LIMIT: i64 = 7;
    let app = limited(kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: LIMIT }).await;
    let prompts = (0..SENT).map(|i| format!("task {i}")).collect();
    let answers = submit_while_locked(&app, "bob", prompts).await;
    let statuses = statuses(&answers);
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), LIMIT as usize, "{statuses:?}");
    for refused in answers.into_iter().filter(|r| r.status() == 429) {
        let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry_after), "retry after {retry_after} s");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("per minute"), "{body}");
    }
    assert!(commits_of_runs(&app, "bob").await <= 4);
}

/// A submission the database refuses fails alone: its statement is tried
/// again one submission at a time, and the others are admitted.
#[tokio::test]
async fn a_submission_the_database_refuses_fails_only_itself() {
    let app = limited(kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: 1000 }).await;
    app.sql()
        .await
        .batch_execute(
            "CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN IF NEW.prompt = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER test_refuse_poison BEFORE INSERT ON runs
                 FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();",
        )
        .await
        .unwrap();
    let prompts = (0..SENT).map(|i| if i == SENT / 2 { "poison".into() } else { format!("task {i}") }).collect();
    let answers = submit_while_locked(&app, "carol", prompts).await;
    let statuses = statuses(&answers);
    assert_eq!(statuses[SENT / 2], 500, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), SENT - 1, "{statuses:?}");
    let runs: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, SENT as i64 - 1);
    // A submission after them is admitted: the line is not stuck.
    assert_eq!(submit(&app, "carol", "after").await.status(), 201);
}

/// A client that goes away while its submission waits takes nobody else's
/// with it: the statement it would have shared runs in a task of its own.
#[tokio::test]
async fn a_client_gone_mid_submission_cancels_nobody_elses() {
    let app = limited(kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: 1000 }).await;
    let held = Held::take(&app, "dave").await;
    let first = send(&app, "dave", vec!["gone".into()]);
    held.until_waiting(1).await;
    let others = send(&app, "dave", (0..5).map(|i| i.to_string()).collect());
    until_in_admission(&app, 6).await;
    first.abort();
    let _ = first.await;
    // The one gone leaves the count (its request dropped by the server).
    until_in_admission(&app, 5).await;
    held.release().await;
    assert_eq!(statuses(&others.await.unwrap()), vec![201; 5]);
    let runs: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    // The one that went away may or may not have been admitted (its
    // statement was already sent); the five are.
    assert!((5..=6).contains(&runs), "{runs} runs");
}

/// `kiln_submissions_in_admission` on `/metrics`: the submissions waiting
/// behind a subject's lock are counted while they wait, and leave the
/// count once answered.
#[tokio::test]
async fn the_admissions_backlog_is_on_metrics() {
    const TOKEN: &str = "metrics-token-for-admission";
    let mut api = kiln_api::ApiSettings {
        quota: kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: 1000 },
        ..Default::default()
    };
    api.metrics_token = Some(TOKEN.into());
    let app = TestApp::spawn(Options { worker: false, api, ..Default::default() }).await;
    let gauge = || async {
        let response = app.http.get(app.url("/metrics")).bearer_auth(TOKEN).send().await.unwrap();
        let body = response.text().await.unwrap();
        let line = body.lines().find(|l| l.starts_with("kiln_submissions_in_admission ")).map(str::to_owned);
        line.unwrap_or_else(|| panic!("no kiln_submissions_in_admission in {body}"))
    };
    assert_eq!(gauge().await, "kiln_submissions_in_admission 0");
    let held = Held::take(&app, "erin").await;
    let sent = send(&app, "erin", (0..3).map(|i| i.to_string()).collect());
    held.until_waiting(1).await;
    until_in_admission(&app, 3).await;
    assert_eq!(gauge().await, "kiln_submissions_in_admission 3");
    held.release().await;
    assert_eq!(statuses(&sent.await.unwrap()), vec![201; 3]);
    assert_eq!(gauge().await, "kiln_submissions_in_admission 0");
}

/// Plain candidates as the admission statement's arrays.
struct Candidates {
    owners: Vec<String>,
    run_ids: Vec<uuid::Uuid>,
    session_ids: Vec<uuid::Uuid>,
    text: Vec<&'static str>,
    json: Vec<serde_json::Value>,
    none: Vec<Option<&'static str>>,
    trigger: Vec<&'static str>,
}

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

impl Candidates {
    /// One candidate for each of `owners`, in their order.
    fn of(owners: &[&str]) -> Candidates {
        let n = owners.len();
        let ids = || (0..n).map(|_| uuid::Uuid::now_v7()).collect::<Vec<_>>();
        Candidates {
            owners: owners.iter().map(|o| o.to_string()).collect(),
            run_ids: ids(),
            session_ids: ids(),
            text: vec!["x"; n],
            json: vec![json!({}); n],
            none: vec![None; n],
            trigger: vec!["api"; n],
        }
    }

    /// The statement's `$1` to `$16`: the candidates, then the limits.
    fn params<'a>(&'a self, active: Param<'a>, recent: Param<'a>) -> [Param<'a>; 16] {
        let Candidates { owners, run_ids, session_ids, text, json, none, trigger } = self;
        [
            owners,
            run_ids,
            session_ids,
            text,
            json,
            json,
            trigger,
            none,
            json,
            none,
            text,
            json,
            none,
            none,
            active,
            recent,
        ]
    }
}

/// The statement that admits a subject's submissions is planned cheap, for
/// any batch and whether Postgres plans it for the values or generically:
/// costed like the cross join of the quota check's 1,000 rows (a set
/// function's default estimate) with the candidates, it was compiled with
/// JIT at every execution, about half a second each.
#[tokio::test]
async fn the_admission_statement_is_never_planned_for_jit() {
    let app = limited(kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: 1000 }).await;
    let sql = app.sql().await;
    let jit_above: f64 = sql.query_one("SELECT current_setting('jit_above_cost')::float8", &[]).await.unwrap().get(0);
    let subjects: Vec<String> = (0..64).map(|i| format!("subject {i}")).collect();
    let subjects: Vec<&str> = subjects.iter().map(String::as_str).collect();
    // One subject's statement (a counted line's), and one of many subjects
    // (the unlimited line's, each subject checked).
    for candidates in [Candidates::of(&["eve"; 64]), Candidates::of(&subjects)] {
        let params = candidates.params(&1000i64, &1000i64);
        let explain = format!("EXPLAIN (FORMAT JSON) {}", kiln_store::admission_statement());
        for mode in ["force_custom_plan", "force_generic_plan"] {
            sql.execute(&format!("SET plan_cache_mode = {mode}"), &[]).await.unwrap();
            let plan: serde_json::Value = sql.query_one(&explain, &params).await.unwrap().get(0);
            let cost = plan[0]["Plan"]["Total Cost"].as_f64().unwrap();
            assert!(cost < jit_above, "{mode}: cost {cost}, JIT above {jit_above}");
            assert!(plan[0].get("JIT").is_none(), "{mode}: {plan}");
        }
    }
}

/// With no connection to be had, a statement's submissions all hear that
/// the database is unavailable at once: tried again one at a time, each
/// would wait out the pool's timeout (5 s) in turn. The "database" here is
/// a loopback listener that accepts and never answers.
#[tokio::test]
async fn with_no_connection_to_be_had_a_statements_submissions_fail_together() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("postgres://kiln:kiln@{}/kiln", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut accepted = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            accepted.push(socket);
        }
    });
    let store = kiln_store::Store::connect(&url, 16).unwrap();
    let quota = kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: 1000 };
    let started = Instant::now();
    let answers = join_all((0..SENT).map(|i| {
        let store = store.clone();
        async move {
            let new = kiln_store::NewRun {
                owner: "frank".into(),
                spec: kiln_protocol::CreateRun::new(format!("task {i}")),
                trigger: kiln_protocol::Trigger::Api,
                idempotency_key: None,
            };
            store.create_run_within(new, Some(&quota)).await
        }
    }))
    .await;
    let elapsed = started.elapsed();
    held.abort();
    assert!(answers.iter().all(|a| a.as_ref().is_err_and(|e| e.is_unavailable())), "{answers:?}");
    // Two statements' worth of waiting (the two a subject may have under
    // way, then the rest together), not one per submission.
    assert!(elapsed < Duration::from_secs(30), "{SENT} submissions took {elapsed:?}");
}

/// Rows of `runs` and its indexes this connection's transaction has read.
async fn rows_read(sql: &tokio_postgres::Transaction<'_>) -> i64 {
    sql.query_one(
        "SELECT pg_stat_get_xact_tuples_returned('runs'::regclass)
              + (SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint FROM pg_index
                 WHERE indrelid = 'runs'::regclass)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A quota check reads what its limits need, not the subject's backlog: a
/// subject with 3,000 queued runs, all made in the last minute (runs the
/// quota did not count: from before a lower limit, or a worker's), is
/// refused as before, and the admission statement reads at most its limits'
/// worth of rows. Counting them all cost ~5 ms a submission at 10,000.
#[tokio::test]
async fn a_backlog_past_the_limits_costs_a_check_no_more_than_its_limits() {
    const ACTIVE: i64 = 20;
    const PER_MINUTE: i64 = 60;
    const BACKLOG: i64 = 3_000;
    let app = limited(kiln_store::Quota { max_active_runs: ACTIVE, max_runs_per_minute: PER_MINUTE }).await;
    let mut sql = app.sql().await;
    sql.batch_execute(&format!(
        "INSERT INTO sessions (id, owner) VALUES ('00000000-0000-0000-0000-000000000001', 'grace');
         INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, policy, trigger, last_event_seq)
             SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000001', owner, 'queued', 'old', '{{}}', '{{}}',
                    '{{}}', 'api', 1
             FROM generate_series(1, {BACKLOG}), (VALUES ('grace'), ('someone else')) AS o(owner);
         -- As autovacuum would (a table is analyzed after a tenth of it
         -- changes): without statistics Postgres guesses a handful of rows
         -- and reads the index with a bitmap, which takes every entry
         -- before the limit can stop it.
         ANALYZE runs;"
    ))
    .await
    .unwrap();
    let refused = submit(&app, "grace", "one more").await;
    assert_eq!(refused.status(), 429);
    assert!(refused.text().await.unwrap().contains("active runs"));

    let candidates = Candidates::of(&["grace"]);
    let params = candidates.params(&Some(ACTIVE), &Some(PER_MINUTE));
    let tx = sql.transaction().await.unwrap();
    let before = rows_read(&tx).await;
    let rows = tx.query(&kiln_store::admission_statement(), &params).await.unwrap();
    let read = rows_read(&tx).await - before;
    let admitted: bool = rows[0].get("admitted");
    assert!(!admitted, "the backlog is past the limit");
    // A few times the limits at most (a scan passes the other subject's
    // rows beside this one's), where counting the backlog read 6,000.
    assert!(read <= 3 * (ACTIVE + PER_MINUTE), "the check read {read} rows for limits of {ACTIVE} and {PER_MINUTE}");
    tx.rollback().await.unwrap();
}

/// With no limits there is nothing to count: a submission takes no
/// per-subject lock, so one whose subject's lock is held elsewhere goes
/// through at once (with a limit it waits for the lock, as the tests above
/// rely on).
#[tokio::test]
async fn with_no_limits_a_submission_takes_no_subject_lock() {
    let unlimited = kiln_store::Quota::UNLIMITED;
    let app = limited(kiln_store::Quota { max_active_runs: unlimited, max_runs_per_minute: unlimited }).await;
    let held = Held::take(&app, "heidi").await;
    let answer = tokio::time::timeout(Duration::from_secs(10), submit(&app, "heidi", "no quota")).await;
    held.release().await;
    let answer = answer.expect("a submission without limits waited for its subject's lock");
    assert_eq!(answer.status(), 201);
    let runs: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, 1);
}

/// With no quota there is no subject lock to keep subjects apart: twenty
/// subjects' submissions that arrive together share a statement and its
/// commit, as one subject's do, where each subject's line of its own made
/// a commit each. Inserts into `runs` wait here while a transaction holds
/// the table in `SHARE` mode, so that the submissions gather.
#[tokio::test]
async fn with_no_limits_many_subjects_submissions_share_a_statement() {
    let unlimited = kiln_store::Quota::UNLIMITED;
    let app = limited(kiln_store::Quota { max_active_runs: unlimited, max_runs_per_minute: unlimited }).await;
    let mut blocker = app.sql().await;
    let held = blocker.transaction().await.unwrap();
    held.batch_execute("LOCK TABLE runs IN SHARE MODE").await.unwrap();
    let sent = tokio::spawn({
        let (http, url) = (app.http.clone(), app.url("/v1/runs"));
        async move {
            let each = (0..SENT).map(|i| {
                let request = http.post(&url).bearer_auth(token(&format!("subject-{i}")));
                request.json(&json!({"prompt": format!("task {i}")})).send()
            });
            join_all(each).await.into_iter().map(|r| r.unwrap().status().as_u16()).collect::<Vec<_>>()
        }
    });
    let sql = app.sql().await;
    until_waiting_for(&sql, "relation", 1).await;
    until_in_admission(&app, SENT).await;
    held.rollback().await.unwrap();
    assert_eq!(sent.await.unwrap(), vec![201; SENT]);
    let row = sql.query_one("SELECT count(DISTINCT owner), count(DISTINCT xmin::text) FROM runs", &[]).await.unwrap();
    let (subjects, commits): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(subjects, SENT as i64);
    // The two statements that waited for the table, then the rest together.
    assert!(commits <= 4, "{SENT} subjects' runs admitted in {commits} commits");
}

/// A statement that carries several subjects' candidates counts each
/// subject apart, each candidate after those of its own subject before it:
/// under an active limit of one, each subject's first is admitted and its
/// second refused, whatever the order they are interleaved in.
#[tokio::test]
async fn a_statement_of_several_subjects_counts_each_subject_apart() {
    let app = limited(kiln_store::Quota { max_active_runs: 1, max_runs_per_minute: 1000 }).await;
    let sql = app.sql().await;
    let candidates = Candidates::of(&["ivan", "judy", "judy", "ivan", "kim"]);
    let params = candidates.params(&Some(1i64), &Some(1000i64));
    let rows = sql.query(&kiln_store::admission_statement(), &params).await.unwrap();
    let mut verdicts: Vec<(i64, bool, i64, i64)> =
        rows.iter().map(|r| (r.get("n"), r.get("admitted"), r.get("k"), r.get("active_runs"))).collect();
    verdicts.sort();
    // (place in the statement, admitted, place among its subject's, that
    // subject's active runs as counted before the statement)
    assert_eq!(verdicts, vec![(1, true, 1, 0), (2, true, 1, 0), (3, false, 2, 0), (4, false, 2, 0), (5, true, 1, 0)]);
    let owners: Vec<String> =
        sql.query("SELECT owner FROM runs ORDER BY owner", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(owners, ["ivan", "judy", "kim"]);
}
