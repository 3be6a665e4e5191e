//! The code reads top to bottom (issue 32): no production function is over
//! 60 lines — in the worker, the API, the store, the CLI, the toolbox
//! and the protocol — so each step fits on a screen and a long one is split
//! into named steps. Read from the sources: from a `fn` line to the closing
//! brace at its indentation, unit tests (`#[cfg(test)]` and files named
//! `*_tests.rs`) left out. The scripted model, the tests and the benches
//! are not production code and are not held to it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// Longest a function may be, signature and closing brace included.
const MAX_LINES: usize = 60;

/// The production crates, by directory.
const CRATES: [&str; 6] = ["worker", "api", "store", "cli", "toolbox", "protocol"];

fn src_of(krate: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.file_stem().unwrap().to_string_lossy().ends_with("_tests")
            && path.file_name().is_none_or(|n| n != "test_support.rs")
        {
            out.push(path);
        }
    }
}

/// `(name, first line, lines)` of each function in `source` over `max`.
fn long_functions(source: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = source.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else { continue };
        let qualifiers = ["pub", "pub(crate)", "pub(super)", "async", "const", "unsafe"];
        if !words[..at].iter().all(|w| qualifiers.contains(w)) || trimmed.starts_with("//") {
            continue;
        }
        let name: String =
            words.get(at + 1).unwrap_or(&"").chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // A declaration without a body (in a trait) ends with `;`.
        let Some(open) = (i..lines.len()).find(|&j| lines[j].contains('{') || lines[j].trim_end().ends_with(';'))
        else {
            continue;
        };
        if !lines[open].contains('{') {
            continue;
        }
        let close = (open..lines.len())
            .find(|&j| {
                j > i
                    && lines[j].get(..indent).is_some_and(|lead| lead.bytes().all(|b| b == b' '))
                    && lines[j].get(indent..).is_some_and(|rest| rest.starts_with('}'))
            })
            .or_else(|| lines[open].trim_end().ends_with('}').then_some(open));
        if let Some(close) = close
            && close + 1 - i > max
        {
            out.push((name, i + 1, close + 1 - i));
        }
    }
    out
}

#[test]
fn no_production_function_is_much_over_sixty_lines() {
    let mut long = Vec::new();
    for krate in CRATES {
        let src = src_of(krate);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(files.len() > 3, "{krate}'s sources were read: {}", files.len());
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap();
            for (name, line, lines) in long_functions(&source, MAX_LINES) {
                long.push(format!(
                    "{krate}/src/{}:{line} {name} ({lines} lines)",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(long.is_empty(), "split these into named steps (at most {MAX_LINES} lines each): {long:#?}");
}

#[test]
fn the_reader_measures_a_function_to_its_closing_brace() {
    let body: String = (0..80).map(|i| format!("    let x{i} = {i};\n")).collect();
    let source = format!(
        "pub async fn long(\n    a: u32,\n) -> u32 {{\n{body}    a\n}}\n\nfn short() {{}}\n\ntrait T {{\n    fn declared(&self);\n}}\n"
    );
    assert_eq!(long_functions(&source, MAX_LINES), [("long".to_owned(), 1, 85)]);
    assert!(long_functions(&source, 100).is_empty());
}
