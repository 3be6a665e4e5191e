//! The integration suite as one test binary: each file beside this one is a
//! module of it, not a test target of its own (`autotests = false` in
//! Cargo.toml). Linked once instead of once per file: the sixty binaries,
//! each linking the whole workspace (~110 MB), made the test build ~9 GB
//! and most of its link time. nextest still runs every test in a process of
//! its own; a test's name starts with its file's (`sandbox::…`).
//!
//! A file added here must be named below; `every_test_file_is_in_the_suite`
//! fails until it is.

mod admission;
mod agent_loop;
mod any_image;
mod api;
mod attempts;
mod callbacks;
mod changes;
mod changes_api;
mod claim_wakeups;
mod cli;
mod cli_attempts;
mod cli_changes;
mod cli_covers_api;
mod control;
mod deploy;
mod egress;
mod end_to_end;
mod ends_together;
mod environment_tenancy;
mod environment_warm;
mod environments;
mod event_ids;
mod faults;
mod feed_reads;
mod function_length;
mod git_delivery;
mod github_attempts;
mod github_delivery;
mod github_webhook;
mod handover;
mod harness;
mod http_limits;
mod layering;
mod mcp;
mod mcp_environments;
mod mcp_stdio;
mod metrics;
mod openapi;
mod prompt_cache;
mod queue;
mod readme;
mod real_model;
mod recovery;
mod repo_clone;
mod retention;
mod run_logs;
mod sandbox;
mod sandbox_disk;
mod sandbox_runtime;
mod sandbox_spec;
mod scale;
mod sessions;
mod setup_secrets;
mod slow_client;
mod stream_tokens;
mod subagents;
mod takeover;
mod traces;
mod view_large;
mod web_view;
mod web_view_attempts;
mod web_view_words;

/// A test file not named above would never be compiled or run.
#[test]
fn every_test_file_is_in_the_suite() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let suite = std::fs::read_to_string(dir.join("suite.rs")).expect("the suite's own source");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the tests directory") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path.file_stem().and_then(|n| n.to_str()) else { continue };
        if path.extension().is_some_and(|e| e == "rs")
            && name != "suite"
            && !suite.contains(&format!("\nmod {name};\n"))
        {
            missing.push(name.to_owned());
        }
    }
    assert!(missing.is_empty(), "test files not in tests/tests/suite.rs: {missing:?}");
}
