//! The README is executable: every `kiln …` command it (or docs/) shows
//! names subcommands and flags the binary has, and every curl example runs
//! against a live Kiln at `$KILN_URL` with `$KILN_TOKEN`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_scripted_model::Reply;
use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::{Options, TestApp, token};

/// README.md and docs/*.md, by name.
fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths.into_iter().map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap())).collect()
}

/// A document cut into its fenced code blocks' commands (continuation
/// lines joined, a `$ ` prompt dropped) and its prose's inline code spans.
struct Snippets {
    commands: Vec<String>,
    spans: Vec<String>,
}

fn snippets(text: &str) -> Snippets {
    let (mut commands, mut prose) = (Vec::new(), String::new());
    let mut in_block = false;
    let mut pending = String::new();
    let mut joined_by_backslash = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            if !pending.is_empty() {
                commands.push(std::mem::take(&mut pending));
            }
            continue;
        }
        if !in_block {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        if pending.is_empty() {
            let line = line.trim();
            let line = line.strip_prefix("$ ").unwrap_or(line);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            pending.push_str(line);
        } else {
            pending.push(if joined_by_backslash { ' ' } else { '\n' });
            pending.push_str(if joined_by_backslash { line.trim_start() } else { line });
        }
        // A command goes on after a trailing backslash, and a curl command
        // inside a quote (a JSON body over several lines).
        joined_by_backslash = pending.ends_with('\\');
        if joined_by_backslash {
            pending.pop();
        } else if !pending.starts_with("curl ") || quotes_closed(&pending) {
            commands.push(std::mem::take(&mut pending).trim().to_owned());
        }
    }
    let spans =
        prose.split('`').skip(1).step_by(2).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    Snippets { commands, spans }
}

/// Whether every shell quote in `text` is closed (single quotes take
/// everything literally; a backslash escapes outside them).
fn quotes_closed(text: &str) -> bool {
    let (mut single, mut double, mut escaped) = (false, false, false);
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    !single && !double
}

/// The words after `kiln ` (or `cargo run -- `) up to a shell operator or
/// a comment, when `text` is a kiln command.
fn kiln_words(text: &str) -> Option<Vec<String>> {
    let rest = ["kiln ", "cargo run -- ", "cargo run -q -- "].iter().find_map(|p| text.strip_prefix(p))?;
    let words = rest
        .split_whitespace()
        .take_while(|w| !matches!(*w, "#" | "|" | "&&" | ";" | ">" | "2>&1") && !w.starts_with(')'))
        .map(|w| w.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')' | '…' | '"' | '\'')).to_owned())
        .filter(|w| !w.is_empty())
        .collect();
    Some(words)
}

/// `kiln PATH --help`, cached.
struct Help {
    texts: HashMap<Vec<String>, String>,
}

impl Help {
    fn of(&mut self, path: &[String]) -> &str {
        self.texts.entry(path.to_vec()).or_insert_with(|| {
            let out = std::process::Command::new(kiln_bin()).args(path).arg("--help").output().unwrap();
            assert!(out.status.success(), "kiln {path:?} --help: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        })
    }

    fn subcommands(&mut self, path: &[String]) -> Vec<String> {
        let help = self.of(path);
        let Some(list) = help.split("Commands:\n").nth(1) else { return Vec::new() };
        list.lines()
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }
}

/// What is wrong with `words` as a kiln command line, if anything.
fn check(help: &mut Help, words: &[String]) -> Option<String> {
    let first = words.first()?;
    // A placeholder (`kiln <command> --help`, `kiln …`) names no command.
    if first.starts_with('<') || first.is_empty() {
        return None;
    }
    let mut path: Vec<String> = Vec::new();
    for word in words {
        let alternatives: Vec<&str> = word.split(['|', '\\']).filter(|a| !a.is_empty()).collect();
        if word.starts_with("--") {
            let help_text = help.of(&path).to_owned();
            for flag in alternatives {
                let name = flag.split('=').next().unwrap();
                if !help_text.contains(&format!("{name} ")) && !help_text.contains(&format!("{name}\n")) {
                    return Some(format!("`kiln {}` has no flag {name}", path.join(" ")));
                }
            }
            continue;
        }
        let subcommands = help.subcommands(&path);
        if subcommands.is_empty() {
            continue;
        }
        // A command's first word, or any word of which one alternative is
        // a subcommand, must be subcommands; other words are arguments.
        if path.is_empty() || alternatives.iter().any(|a| subcommands.iter().any(|s| s == a)) {
            for alternative in &alternatives {
                if !subcommands.iter().any(|s| s == alternative) {
                    return Some(format!("`kiln {}` has no subcommand {alternative:?}", path.join(" ")));
                }
            }
            // Alternatives (`list|show`) share their flags' check through the first.
            path.push(alternatives[0].to_owned());
        }
    }
    None
}

#[test]
fn every_kiln_command_in_the_readme_and_docs_names_subcommands_and_flags_that_exist() {
    let mut help = Help { texts: HashMap::new() };
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (name, text) in documents() {
        let snippets = snippets(&text);
        for candidate in snippets.commands.iter().chain(&snippets.spans) {
            let Some(words) = kiln_words(candidate) else { continue };
            checked += 1;
            if let Some(problem) = check(&mut help, &words) {
                wrong.push(format!("{name}: `{candidate}`: {problem}"));
            }
        }
    }
    assert!(checked > 40, "only {checked} kiln commands found: the extraction broke");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checker_refuses_what_does_not_exist() {
    let mut help = Help { texts: HashMap::new() };
    let words = |s: &str| kiln_words(s).unwrap();
    assert!(check(&mut help, &words("kiln follow RUN")).is_some(), "no such subcommand");
    assert!(check(&mut help, &words("kiln run --prompt x --nope")).is_some(), "no such flag");
    assert!(check(&mut help, &words("kiln env list|frobnicate")).is_some(), "no such alternative");
    assert!(check(&mut help, &words("kiln env create web --secrets - --var A=1")).is_none());
}

/// The curl examples, as runnable shell commands.
fn curl_examples() -> Vec<String> {
    let mut examples = Vec::new();
    for (_, text) in documents() {
        let snippets = snippets(&text);
        for candidate in snippets.commands.iter().chain(&snippets.spans) {
            if candidate.starts_with("curl ") {
                examples.push(candidate.clone());
            }
        }
    }
    examples
}

#[tokio::test]
async fn every_curl_example_runs_against_a_live_kiln() {
    let mut options = Options { script: vec![Reply::text("Done.")], ..Default::default() };
    let key = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    options.api.secrets_key = Some(std::sync::Arc::new(kiln_store::secrets::SecretsKey::from_hex(key).unwrap()));
    let app = TestApp::spawn(options).await;
    app.model.replay_per_conversation();
    // The examples' working directory, with the demo repository `kiln up
    // --demo` creates.
    let cwd = tempfile::tempdir().unwrap();
    let demo = cwd.path().join(".kiln/demo-repo");
    std::fs::create_dir_all(&demo).unwrap();
    std::fs::write(demo.join("README.md"), "# demo\n").unwrap();
    kiln_tests::git_repo::git(&demo, &["init", "-q"]);
    kiln_tests::git_repo::git(&demo, &["add", "."]);
    kiln_tests::git_repo::git(&demo, &["commit", "-q", "-m", "one"]);

    let examples = curl_examples();
    assert!(examples.len() >= 5, "{examples:?}");
    let mut last_run = None::<String>;
    for example in examples {
        let command = match &last_run {
            Some(id) => example.replace("RUN_ID", id),
            None => example.clone(),
        };
        assert!(!command.contains("RUN_ID"), "an example needs a run made by an earlier one: {example}");
        // Any HTTP error fails the example; none may hang.
        let script = format!("curl() {{ command curl --fail-with-body --max-time 120 \"$@\"; }}\n{command}");
        let out = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(cwd.path())
            .env("KILN_URL", app.url(""))
            .env("KILN_TOKEN", token("alice"))
            .output();
        let out = tokio::time::timeout(Duration::from_secs(150), out).await.expect("the example ended").unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{example}\n{said}\n{}", String::from_utf8_lossy(&out.stderr));
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&said)
            && let Some(id) = value["id"].as_str()
            && value["status"].is_string()
        {
            last_run = Some(id.to_owned());
        }
        if example.contains("/events") {
            assert!(said.contains("event: run.succeeded"), "the run's events to its end: {said}");
        }
    }
    assert!(cwd.path().join("kiln.json").exists(), "the openapi example wrote its file");
}
