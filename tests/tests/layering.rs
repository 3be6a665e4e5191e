//! The crates' files form layers: no two files of one crate import each
//! other (docs/architecture.md, "Who imports whom"). Read from the sources:
//! every `crate::…` path outside comments and the unit tests, resolved to
//! the file that defines the module it names.
//!
//! Pairs still there would be listed below with the issue that removes
//! them; a new pair fails, and so does a listed pair that is gone (so the
//! list shrinks as they are removed). The worker's top-level modules also form
//! the layers docs/architecture.md draws ("The worker's layers"): an import
//! up them fails, unless that page says it is deliberate.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Pairs of files that import each other today, per crate, to be removed
/// (none left: keep it so). Module paths, `a::b` for `src/a/b.rs` or
/// `src/a/b/mod.rs`.
const KNOWN: &[(&str, &str, &str)] = &[];

const CRATES: &[&str] = &["protocol", "store", "api", "worker", "cli", "toolbox", "scripted-model"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// Every `.rs` file under `src`, by module path.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            let parts: Vec<&str> =
                parts.iter().map(String::as_str).filter(|p| !matches!(*p, "mod" | "lib" | "main")).collect();
            let source = std::fs::read_to_string(&path).unwrap();
            out.insert(parts.join("::"), source);
        }
    }
    out
}

/// The code of a file without its comments and its `mod tests`.
fn code(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => &source[..at],
        None => source,
    };
    source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The module paths a file's `crate::` paths name (`crate::a::b::C`,
/// `crate::a::{b, c::D}`), not yet resolved to files.
fn named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let base = rest[..end].trim_end_matches(':');
        if rest[end..].starts_with('{') {
            let inner = &rest[end + 1..rest[end..].find('}').map_or(rest.len(), |i| end + i)];
            for item in inner.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let item = item.split_whitespace().next().unwrap_or(item);
                out.push(if base.is_empty() { item.to_owned() } else { format!("{base}::{item}") });
            }
        } else {
            out.push(base.to_owned());
        }
    }
    out
}

/// The longest module path that is a file and prefixes `path`.
fn resolve<'a>(files: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len()).rev().find_map(|n| files.get_key_value(&parts[..n].join("::")).map(|(k, _)| k.as_str()))
}

/// Pairs of files of `krate` that import each other.
fn mutual(krate: &str) -> BTreeSet<(String, String)> {
    let files = modules(&root().join(krate).join("src"));
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, source) in &files {
        for path in named(&code(source)) {
            let Some(target) = resolve(&files, &path) else { continue };
            // A module's own children and its parents (`mod.rs`) are its
            // own; the crate root is everyone's.
            let related = target.is_empty()
                || target == module
                || module.starts_with(&format!("{target}::"))
                || target.starts_with(&format!("{module}::"));
            if !related {
                edges.entry(module).or_default().insert(target);
            }
        }
    }
    let mut pairs = BTreeSet::new();
    for (a, targets) in &edges {
        for b in targets {
            if a < b && edges.get(b).is_some_and(|back| back.contains(a)) {
                pairs.insert((a.to_string(), b.to_string()));
            }
        }
    }
    pairs
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut found = BTreeSet::new();
    for krate in CRATES {
        for (a, b) in mutual(krate) {
            found.insert((krate.to_string(), a, b));
        }
    }
    let known: BTreeSet<(String, String, String)> =
        KNOWN.iter().map(|(k, a, b)| (k.to_string(), a.to_string(), b.to_string())).collect();
    let new: Vec<_> = found.difference(&known).collect();
    assert!(new.is_empty(), "files that import each other (put what both need in a module of its own): {new:?}");
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(gone.is_empty(), "these pairs are gone: remove them from KNOWN in tests/tests/layering.rs: {gone:?}");
}

#[test]
fn the_reader_sees_imports_through_braces_and_not_in_comments() {
    let source = "use crate::a::{b, c::D};\nuse crate::{e, f::G as H};\n// crate::hidden\nfn x() { crate::i::j(); }\n#[cfg(test)]\nmod tests { use crate::k; }\n";
    assert_eq!(named(&code(source)), ["a::b", "a::c::D", "e", "f::G", "i::j"]);
}

/// The worker's layers as docs/architecture.md draws them ("The worker's
/// layers"): one line per layer, top first, its modules before the first
/// run of two spaces, comma-separated (`agent/` is the module `agent`).
fn documented_layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = &doc[doc.find("### The worker's layers").expect("the section is there")..];
    let block = &section[section.find("```\n").expect("the list opens") + 4..];
    let block = &block[..block.find("```").expect("the list closes")];
    block
        .lines()
        .map(|line| {
            let names = line.split("  ").next().unwrap_or_default();
            names.split(',').map(|m| m.trim().trim_end_matches('/').to_owned()).filter(|m| !m.is_empty()).collect()
        })
        .collect()
}

/// Imports between the worker's top-level modules that go up (or sideways
/// to another module of the same line) in `layers`, as (from, to).
fn upward(layers: &[Vec<String>]) -> BTreeSet<(String, String)> {
    let rank: BTreeMap<&str, usize> =
        layers.iter().enumerate().flat_map(|(i, line)| line.iter().map(move |m| (m.as_str(), i))).collect();
    let files = modules(&root().join("worker/src"));
    let mut out = BTreeSet::new();
    for (module, source) in &files {
        let from = module.split("::").next().unwrap_or_default();
        if from.is_empty() {
            continue;
        }
        let from_rank = *rank.get(from).unwrap_or_else(|| panic!("worker module `{from}` is on no line of the layers"));
        for path in named(&code(source)) {
            let to = path.split("::").next().unwrap_or_default();
            if to == from || !files.contains_key(to) && !files.keys().any(|k| k.starts_with(&format!("{to}::"))) {
                continue;
            }
            let to_rank = *rank.get(to).unwrap_or_else(|| panic!("worker module `{to}` is on no line of the layers"));
            if to_rank <= from_rank {
                out.insert((from.to_owned(), to.to_owned()));
            }
        }
    }
    out
}

/// The loop docs/architecture.md says is deliberate: `config` names the
/// settings of the modules that take the context.
const DELIBERATE_UPWARD: &[(&str, &str)] =
    &[("config", "environment"), ("config", "git_delivery"), ("config", "github")];

#[test]
fn the_workers_modules_form_the_documented_layers() {
    let layers = documented_layers();
    assert!(layers.len() > 10, "the list was read: {layers:?}");
    let found = upward(&layers);
    let deliberate: BTreeSet<(String, String)> =
        DELIBERATE_UPWARD.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let new: Vec<_> = found.difference(&deliberate).collect();
    assert!(new.is_empty(), "imports up the worker's layers (docs/architecture.md): {new:?}");
    let gone: Vec<_> = deliberate.difference(&found).collect();
    assert!(gone.is_empty(), "no longer there: remove from DELIBERATE_UPWARD and the docs: {gone:?}");
}

#[test]
fn the_layer_check_sees_an_import_up_the_layers() {
    // `agent` below `subagent`: the loop importing the sub-agents is caught.
    let mut layers = documented_layers();
    let agent = layers.iter().position(|l| l.iter().any(|m| m == "agent")).unwrap();
    let subagent = layers.iter().position(|l| l.iter().any(|m| m == "subagent")).unwrap();
    layers.swap(agent, subagent);
    let found = upward(&layers);
    assert!(found.contains(&("subagent".to_owned(), "agent".to_owned())), "{found:?}");
}
