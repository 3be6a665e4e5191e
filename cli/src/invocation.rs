//! How the user runs `kiln`, for the commands that hints print.
//!
//! The README's first command is `cargo run -- up`: a newcomer who copies
//! a printed `kiln logs …` gets "command not found", as `kiln` is not on
//! their PATH. `cargo run` gives the binary it runs its package's variables
//! (`CARGO_PKG_NAME` and the rest), so the `kiln` binary seeing its own
//! package name there was started by `cargo run` in this workspace.

use std::sync::OnceLock;

/// What to type to run `kiln`: `cargo run --` under `cargo run`, else `kiln`.
pub fn kiln() -> &'static str {
    static COMMAND: OnceLock<&'static str> = OnceLock::new();
    COMMAND.get_or_init(|| {
        // The `kiln` binary itself, not this crate's unit tests (which cargo
        // also runs with the package's variables).
        let is_kiln = std::env::current_exe().ok().is_some_and(|exe| exe.file_stem().is_some_and(|s| s == "kiln"));
        let package = std::env::var("CARGO_PKG_NAME").ok();
        command_for(package.as_deref(), std::env::var_os("CARGO").is_some(), is_kiln)
    })
}

fn command_for(package: Option<&str>, under_cargo: bool, is_kiln: bool) -> &'static str {
    if is_kiln && under_cargo && package == Some(env!("CARGO_PKG_NAME")) { "cargo run --" } else { "kiln" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cargo_running_the_kiln_binary_means_cargo_run() {
        assert_eq!(command_for(Some(env!("CARGO_PKG_NAME")), true, true), "cargo run --");
        // A test process of another package, whose child is `kiln`.
        assert_eq!(command_for(Some("kiln-tests"), true, true), "kiln");
        assert_eq!(command_for(None, false, true), "kiln");
        assert_eq!(command_for(Some(env!("CARGO_PKG_NAME")), false, true), "kiln");
        // This crate's own unit tests, which cargo runs with its variables.
        assert_eq!(command_for(Some(env!("CARGO_PKG_NAME")), true, false), "kiln");
    }
}
