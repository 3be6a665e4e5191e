//! `kiln diff` and `kiln apply`, the real binary against a real Kiln, with
//! a run whose change was made by real git and saved through the store as
//! the worker saves its capture: the patch as kept, its diffstat, and a
//! three-way apply that either goes in whole or leaves the checkout
//! exactly as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use kiln_protocol::changes::{ChangeScope, RunChanges};
use kiln_tests::changes::staged_change;
use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, token};
use uuid::Uuid;

async fn kiln(app: &TestApp, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.args(args)
        .env("KILN_URL", app.url(""))
        .env("KILN_TOKEN", token("alice"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), cmd.output()).await.expect("kiln finished in time").unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A repository, and a run of it that edited, added, deleted and renamed
/// files and added a binary one; the clone the change was made in.
struct Changed {
    _repo: tempfile::TempDir,
    url: String,
    base: String,
    work: tempfile::TempDir,
    run: Uuid,
    patch: Vec<u8>,
}

async fn a_run_that_changed_files(app: &TestApp) -> Changed {
    let (repo, url) = repo_with(&[
        ("README.md", "hello\n"),
        ("old.txt", "going\n"),
        ("src/lib.rs", "pub fn answer() -> u32 {\n    42\n}\n"),
    ]);
    let base = git(repo.path(), &["rev-parse", "HEAD"]);
    let work = tempfile::tempdir().unwrap();
    git(work.path(), &["clone", "-q", &url, "."]);
    std::fs::write(work.path().join("README.md"), "hello\nworld\n").unwrap();
    std::fs::write(work.path().join("NEW.md"), "new\n").unwrap();
    std::fs::write(work.path().join("logo.bin"), [0u8, 159, 146, 150, 0, 1]).unwrap();
    std::fs::remove_file(work.path().join("old.txt")).unwrap();
    git(work.path(), &["mv", "src/lib.rs", "src/core.rs"]);
    let change = staged_change(work.path(), &base, ChangeScope::Run);
    let patch = change.patch.clone().unwrap();
    let run = app.run_with_change("alice", &url, &[change]).await;
    Changed { _repo: repo, url, base, work, run, patch }
}

/// Every file under `dir`, `.git` included: its bytes (a symlink's
/// target) and mode. Equal snapshots: nothing was touched.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let relative = path.strip_prefix(dir).unwrap().to_path_buf();
            if meta.file_type().is_symlink() {
                out.insert(relative, (0, std::fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()));
            } else if meta.is_dir() {
                out.insert(relative, (meta.permissions().mode(), Vec::new()));
                stack.push(path);
            } else {
                out.insert(relative, (meta.permissions().mode(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

fn clone_at(url: &str, base: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["clone", "-q", url, "."]);
    git(dir.path(), &["checkout", "-q", base]);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kiln_diff_shows_the_patch_as_kept_its_diffstat_and_its_json() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let changed = a_run_that_changed_files(&app).await;
    let run = changed.run.to_string();

    // Piped: exactly the bytes the API keeps, what `git apply` takes.
    let out = kiln(&app, &["diff", &run]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, changed.patch);

    let out = kiln(&app, &["diff", "--stat", &run]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        " NEW.md                    | 1 +\n \
          README.md                 | 1 +\n \
          logo.bin                  | Bin\n \
          old.txt                   | 1 -\n \
          src/lib.rs => src/core.rs | 0 \n \
          5 files changed, 2 insertions(+), 1 deletion(-)\n"
    );

    let out = kiln(&app, &["diff", "--json", &run]).await;
    let changes: RunChanges = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((changes.run_id, changes.base_commit.as_deref()), (changed.run, Some(changed.base.as_str())));
    assert_eq!(changes.files.len(), 5);

    // The run's log says what it changed, and ends with how to get it.
    let out = kiln(&app, &["logs", &run]).await;
    let log = text(&out.stdout);
    assert!(log.contains("● changed 5 files, 2 insertions(+), 1 deletion(-)\n"), "{log}");
    assert!(
        log.ends_with(&format!(
            " 5 files changed, 2 insertions(+), 1 deletion(-)\napply it: kiln apply {run}   (see it: kiln diff {run})\n"
        )),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kiln_apply_puts_the_change_in_a_checkout_of_its_base() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let changed = a_run_that_changed_files(&app).await;
    let checkout = clone_at(&changed.url, &changed.base);
    let dir = checkout.path().to_str().unwrap();

    let out = kiln(&app, &["apply", &changed.run.to_string(), "--dir", dir]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("5 files changed, 2 insertions(+), 1 deletion(-) (staged"),
        "{}",
        text(&out.stdout)
    );
    // The same tree as where the change was made: every path, byte and mode.
    assert_eq!(git(checkout.path(), &["write-tree"]), git(changed.work.path(), &["write-tree"]));
    assert_eq!(std::fs::read(checkout.path().join("logo.bin")).unwrap(), [0u8, 159, 146, 150, 0, 1]);
}

/// A checkout that moved on where the change lies is left exactly as it
/// was, `.git` included, and the command names the file; likewise a
/// local edit not yet committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_checkout_is_left_byte_identical_and_the_file_named() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let changed = a_run_that_changed_files(&app).await;
    let run = changed.run.to_string();

    let committed = clone_at(&changed.url, &changed.base);
    std::fs::write(committed.path().join("README.md"), "HELLO\n").unwrap();
    git(committed.path(), &["commit", "-qam", "shout"]);
    let edited = clone_at(&changed.url, &changed.base);
    std::fs::write(edited.path().join("README.md"), "hello, local edit\n").unwrap();

    for checkout in [&committed, &edited] {
        let before = snapshot(checkout.path());
        let out = kiln(&app, &["apply", &run, "--dir", checkout.path().to_str().unwrap()]).await;
        let said = text(&out.stderr);
        assert!(snapshot(checkout.path()) == before, "the checkout changed: {said}");
        assert!(!out.status.success(), "a conflict must fail: {said}");
        assert!(said.contains("README.md") && said.contains("nothing was changed"), "{said}");
    }
    let said = text(&kiln(&app, &["apply", &run, "--dir", committed.path().to_str().unwrap()]).await.stderr);
    assert!(said.contains("conflicts with the checkout in: README.md"), "{said}");
}

/// Without the run's base the checkout is refused, with the command that
/// fetches it; that command, pasted, makes the apply work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_without_the_base_is_told_how_to_fetch_it() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let changed = a_run_that_changed_files(&app).await;
    let run = changed.run.to_string();
    let (elsewhere, _) = repo_with(&[("other.txt", "unrelated\n")]);
    let dir = elsewhere.path().to_str().unwrap();

    let before = snapshot(elsewhere.path());
    let out = kiln(&app, &["apply", &run, "--dir", dir]).await;
    let said = text(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains(&format!("does not have the run's base commit {}", changed.base)), "{said}");
    let fetch = said.lines().map(str::trim).find(|l| l.starts_with("git -C ")).expect("the fetch command");
    assert_eq!(fetch, format!("git -C {dir} fetch {} {}", changed.url, changed.base));
    assert!(snapshot(elsewhere.path()) == before);

    let pasted = std::process::Command::new("sh").args(["-c", fetch]).output().unwrap();
    assert!(pasted.status.success(), "{}", text(&pasted.stderr));
    git(elsewhere.path(), &["checkout", "-q", &changed.base]);
    let out = kiln(&app, &["apply", &run, "--dir", dir]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(git(elsewhere.path(), &["write-tree"]), git(changed.work.path(), &["write-tree"]));
}

/// A real run (worker, sandbox, the worker's own capture) followed with
/// `kiln run --follow`: its output ends with what it changed and the
/// command that applies it, and that command does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_run_ends_with_its_diffstat_and_kiln_apply_takes_its_change() {
    let edit = "printf 'world\\n' >> README.md && printf 'new\\n' > NEW.md && rm old.txt";
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", serde_json::json!({ "command": edit })), Reply::text("Edited.")],
        ..Default::default()
    })
    .await;
    let (repo, url) = repo_with(&[("README.md", "hello\n"), ("old.txt", "going\n")]);
    let base = git(repo.path(), &["rev-parse", "HEAD"]);

    let out = kiln(&app, &["run", "--prompt", "edit the files", "--repo", &url, "--follow"]).await;
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    let run = shown.split_whitespace().nth(1).unwrap().to_owned();
    assert!(shown.contains("● changed 3 files, 2 insertions(+), 1 deletion(-)\n"), "{shown}");
    assert!(
        shown.ends_with(&format!(
            " NEW.md    | 1 +\n README.md | 1 +\n old.txt   | 1 -\n 3 files changed, 2 insertions(+), 1 deletion(-)\n\
             apply it: kiln apply {run}   (see it: kiln diff {run})\n"
        )),
        "{shown}"
    );

    let checkout = clone_at(&url, &base);
    let out = kiln(&app, &["apply", &run, "--dir", checkout.path().to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(checkout.path().join("README.md")).unwrap(), "hello\nworld\n");
    assert_eq!(std::fs::read_to_string(checkout.path().join("NEW.md")).unwrap(), "new\n");
    assert!(!checkout.path().join("old.txt").exists());
}
