//! The `kiln` binary's client commands are there, and say what they do.
//!
//! Having an integration test also makes Cargo build `target/<profile>/kiln`
//! within the test build, where `tests/tests/cli.rs` (another package, so
//! without `CARGO_BIN_EXE_kiln`) finds it, built from the same sources.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn help_lists_the_client_commands() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for command in ["run", "runs", "logs", "cancel", "approve"] {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{command} "))), "{command} in\n{help}");
    }
}

#[test]
fn a_client_command_without_a_token_says_what_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["logs", "0199a000-0000-7000-8000-000000000001"])
        .env_remove("KILN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
}
