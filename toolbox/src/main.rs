//! `kiln-toolbox`: serves the toolbox protocol on stdin/stdout until stdin
//! ends. Started once per session with `docker exec -i` (stdin and stdout
//! attached, no TTY) in the workspace directory.

use std::path::PathBuf;
use std::process::ExitCode;

use kiln_toolbox::identity;
use kiln_toolbox::server::{Server, TOOLBOX_VERSION};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let user = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => None,
        ["capture", ..] => return kiln_toolbox::change_capture::main(&args[1..]),
        ["--version"] => {
            println!("kiln-toolbox {TOOLBOX_VERSION}");
            return ExitCode::SUCCESS;
        }
        ["--user", spec] => {
            let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
            match identity::resolve(spec, &read("/etc/passwd"), &read("/etc/group")) {
                Ok(user) => Some(user),
                Err(e) => {
                    eprintln!("kiln-toolbox: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => {
            eprintln!(
                "usage: kiln-toolbox [--version | --user UID[:GID] | capture ARGS]\nSpeaks the Kiln toolbox protocol on stdin/stdout; \
                 with --user (started as root) commands run as that user and file operations are done as that user."
            );
            return ExitCode::from(2);
        }
    };
    // Before any thread exists: every thread inherits these credentials.
    if let Err(e) = identity::assume(user) {
        eprintln!("kiln-toolbox: {e}");
        return ExitCode::FAILURE;
    }
    // Background children of a command whose shell has exited are reparented
    // to us rather than to PID 1 (which may not reap), so we can reap them and
    // confirm a killed process group is really gone.
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!("kiln-toolbox: cannot become a child subreaper ({e}); orphans go to PID 1");
    }
    let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    match Server::new(base).serve(std::io::stdin().lock(), std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln-toolbox: {e}");
            ExitCode::FAILURE
        }
    }
}
