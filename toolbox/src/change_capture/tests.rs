//! The capture against the host's git, in a temporary workspace (the
//! integration tests in `tests/tests/changes.rs` take it in a sandbox,
//! through the worker).

use std::path::Path;
use std::process::Command;

use super::*;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A committed repository of `files` files; its paths and base commit.
fn repository(files: usize) -> (tempfile::TempDir, Paths, String) {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths { keep: dir.path().join("keep"), workspace: dir.path().join("ws") };
    std::fs::create_dir_all(&paths.workspace).unwrap();
    for i in 0..files {
        std::fs::write(paths.workspace.join(format!("f{i}.txt")), format!("line {i}\n")).unwrap();
    }
    git(&paths.workspace, &["init", "-q", "."]);
    git(&paths.workspace, &["add", "-A"]);
    git(&paths.workspace, &["commit", "-q", "-m", "base"]);
    let base = git(&paths.workspace, &["rev-parse", "HEAD"]);
    (dir, paths, base)
}

fn request(base: &str, vouch: (Option<String>, Option<String>)) -> Request {
    Request {
        base: base.into(),
        session_base: base.into(),
        summary_cap: 1 << 20,
        max_patch: 1 << 20,
        vouch_index: vouch.0,
        vouch_base: vouch.1,
    }
}

/// The header's fields and the body.
fn capture(paths: &Paths, request: &Request) -> (Vec<String>, Vec<u8>) {
    let mut out = Vec::new();
    run(paths, request, &mut out).unwrap_or_else(|f| panic!("{f:?}"));
    let end = out.iter().position(|b| *b == b'\n').unwrap();
    let header = String::from_utf8(out[..end].to_vec()).unwrap();
    (header.split(' ').map(str::to_owned).collect(), out[end + 1..].to_vec())
}

fn vouch_of(header: &[String]) -> (Option<String>, Option<String>) {
    let hash = |h: &String| (h != "-").then(|| h.clone());
    (hash(&header[2]), hash(&header[3]))
}

#[test]
fn the_change_is_sent_whole_as_the_header_says() {
    let (_dir, paths, base) = repository(3);
    std::fs::write(paths.workspace.join("f0.txt"), "changed\n").unwrap();
    std::fs::remove_file(paths.workspace.join("f1.txt")).unwrap();
    std::fs::write(paths.workspace.join("new.bin"), [0u8, 1, 2, 255]).unwrap();
    let (header, body) = capture(&paths, &request(&base, (None, None)));
    assert_eq!(header[0], "KILN-CAPTURE");
    assert!(seed::is_hex(&header[1], &[40]), "a tree: {header:?}");
    assert_eq!(header[4..7], ["d", "-", &body.len().to_string()]);
    assert_eq!(header[7..], ["-", "-", "-"]);
    let text = String::from_utf8_lossy(&body);
    for name in ["f0.txt", "f1.txt", "new.bin", "GIT binary patch", "+changed"] {
        assert!(text.contains(name), "{name} in {text}");
    }
    assert!(!text.contains("f2.txt"), "an unchanged file is not in the change");
    let tree = git(&paths.workspace, &["rev-parse", "HEAD^{tree}"]);
    assert_ne!(header[1], tree, "the captured tree is the workspace's, not the base's");
}

#[test]
fn a_vouched_index_is_taken_and_an_unvouched_flagged_one_is_not() {
    let (_dir, paths, base) = repository(20);
    std::fs::write(paths.workspace.join("f3.txt"), "one\n").unwrap();
    let (first, _) = capture(&paths, &request(&base, (None, None)));
    assert!(first[3] != "-", "the base's index, rewritten, is vouched for: {first:?}");
    let (again, body) = capture(&paths, &request(&base, vouch_of(&first)));
    assert_eq!(again[1], first[1], "the same workspace, the same tree");
    assert!(String::from_utf8_lossy(&body).contains("+one"));
    // The agent marks a file assume-unchanged in the kept base index, then
    // changes the file: the worker's vouch no longer matches the edited
    // index, and without a vouch the flag is checked: either way the change
    // is taken.
    let mut vouch = vouch_of(&again);
    for (file, trusted) in [("f4.txt", true), ("f5.txt", false)] {
        let (header, _) = capture(&paths, &request(&base, vouch.clone()));
        vouch = vouch_of(&header);
        let out = Command::new("git")
            .current_dir(&paths.workspace)
            .env("GIT_INDEX_FILE", paths.keep.join("base"))
            .args(["update-index", "--assume-unchanged", file])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(paths.workspace.join(file), format!("hidden in {file}?\n")).unwrap();
        let given = if trusted { vouch.clone() } else { (None, None) };
        let (header, body) = capture(&paths, &request(&base, given));
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(&format!("+hidden in {file}?")), "the flagged {file}'s change is taken: {text}");
        vouch = vouch_of(&header);
    }
}

#[test]
fn a_change_over_the_bound_sends_its_patch_size_and_listing() {
    let (_dir, paths, base) = repository(4);
    for i in 0..4 {
        std::fs::write(paths.workspace.join(format!("f{i}.txt")), "x\n".repeat(200)).unwrap();
    }
    let (_, whole) = capture(&paths, &request(&base, (None, None)));
    let separator = whole.windows(2).position(|w| w == [0, 0]).unwrap() + 1;
    let patch = &whole[separator + 1..];
    // The listing alone is over the summary cap: only its first bytes go.
    let small = Request { summary_cap: 10, max_patch: patch.len() as u64, ..request(&base, (None, None)) };
    let (header, body) = capture(&paths, &small);
    assert_eq!(header[4..7], ["s", &patch.len().to_string(), "10"]);
    assert_eq!(&body[..patch.len()], patch, "the patch is sent exactly");
    assert_eq!(body.len(), patch.len() + 10);
    let smaller = Request { max_patch: patch.len() as u64 - 1, ..small };
    let (header, body) = capture(&paths, &smaller);
    assert_eq!(header[4..7], ["s", &patch.len().to_string(), "10"]);
    assert_eq!(body.len(), 10, "a patch over the bound is not sent");
}

#[test]
fn a_workspace_without_a_repository_is_all_new() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths { keep: dir.path().join("keep"), workspace: dir.path().join("ws") };
    std::fs::create_dir_all(&paths.workspace).unwrap();
    std::fs::write(paths.workspace.join("a.txt"), "a\n").unwrap();
    // The empty tree, as the worker gives it for a run without a repository.
    let empty = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
    let (header, body) = capture(&paths, &request(empty, (None, None)));
    assert_eq!(header[4], "d");
    assert!(String::from_utf8_lossy(&body).contains("new file mode"), "{}", String::from_utf8_lossy(&body));
}

#[test]
fn what_the_agent_planted_in_the_capture_directory_is_replaced() {
    let (_dir, paths, base) = repository(2);
    capture(&paths, &request(&base, (None, None)));
    let git_dir = paths.keep.join("git");
    std::fs::create_dir_all(git_dir.join("info")).unwrap();
    std::fs::write(git_dir.join("info/exclude"), "hidden.txt\n").unwrap();
    std::fs::write(git_dir.join("config"), "[core]\n\tbare = true\n\tignoreStat = true\n").unwrap();
    std::fs::write(paths.workspace.join("hidden.txt"), "h\n").unwrap();
    let (_, body) = capture(&paths, &request(&base, (None, None)));
    assert!(String::from_utf8_lossy(&body).contains("hidden.txt"), "a planted exclude hides nothing");
    assert!(!git_dir.join("info").exists());
}

#[test]
fn requests_are_checked_before_git_sees_them() {
    let good = ["a".repeat(40), "b".repeat(40), "8".into(), "9".into(), "-".into(), "c".repeat(64)];
    let parsed = Request::parse(&good).unwrap();
    assert_eq!((parsed.vouch_index, parsed.vouch_base), (None, Some("c".repeat(64))));
    let mut option = good.clone();
    option[0] = "--output=/etc/passwd".into();
    assert!(Request::parse(&option).is_err(), "a base that is an option is refused");
    let mut size = good.clone();
    size[2] = "-1".into();
    assert!(Request::parse(&size).is_err());
    assert!(Request::parse(&good[..5]).is_err());
}
