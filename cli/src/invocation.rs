//! How the user runs `kiln`, for the commands that hints print.
//!
//! The README's first command is `cargo run -- up`: a newcomer who copies
//! a printed `kiln logs …` gets "command not found", as `kiln` is not on
//! their PATH. `cargo run` gives the binary it runs its package's variables
//! (`CARGO_PKG_NAME` and the rest), so a process that sees its own package
//! name there was started by `cargo run` in this workspace.

use std::sync::OnceLock;

/// What to type to run `kiln`: `cargo run --` under `cargo run`, else `kiln`.
pub fn kiln() -> &'static str {
    static COMMAND: OnceLock<&'static str> = OnceLock::new();
    COMMAND.get_or_init(|| {
        command_for(std::env::var("CARGO_PKG_NAME").ok().as_deref(), std::env::var_os("CARGO").is_some())
    })
}

fn command_for(package: Option<&str>, under_cargo: bool) -> &'static str {
    if under_cargo && package == Some(env!("CARGO_PKG_NAME")) { "cargo run --" } else { "kiln" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cargo_running_this_package_means_cargo_run() {
        assert_eq!(command_for(Some(env!("CARGO_PKG_NAME")), true), "cargo run --");
        // A test process of another package, whose child is `kiln`.
        assert_eq!(command_for(Some("kiln-tests"), true), "kiln");
        assert_eq!(command_for(None, false), "kiln");
        assert_eq!(command_for(Some(env!("CARGO_PKG_NAME")), false), "kiln");
    }
}
