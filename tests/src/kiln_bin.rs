//! The `kiln` binary, for tests that run it as its own process: the
//! terminal client, and workers a test kills or pauses with a signal.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

/// The `kiln` binary. A workspace test run (`scripts/test`) builds it with
/// the tests (kiln-cli has integration tests of its own), next to this test
/// executable's directory; when it is missing or older than the sources
/// (say after `cargo nextest run -p kiln-tests`), Cargo builds it, so these
/// tests never run a stale one. `KILN_BIN` points at another build instead.
pub fn kiln_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("KILN_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().unwrap();
        // Test executables live in target/<profile>/deps.
        let built = exe.parent().and_then(Path::parent).unwrap().join("kiln");
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let fresh = modified(&built).is_some_and(|bin| newest_source(workspace) <= bin);
        if fresh { built } else { cargo_build_kiln(workspace) }
    })
    .clone()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest file the binary is built from: the crates it links, the
/// files they embed (migrations, the web view, prompts), the lock file.
fn newest_source(workspace: &Path) -> SystemTime {
    fn walk(path: &Path, newest: &mut SystemTime) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), newest);
            }
        } else if let Some(t) = modified(path) {
            *newest = (*newest).max(t);
        }
    }
    let mut newest = SystemTime::UNIX_EPOCH;
    for krate in ["cli", "protocol", "store", "api", "worker", "scripted-model", "toolbox"] {
        walk(&workspace.join(krate).join("src"), &mut newest);
        walk(&workspace.join(krate).join("Cargo.toml"), &mut newest);
    }
    for shared in ["migrations", "local-model", "Cargo.toml", "Cargo.lock"] {
        walk(&workspace.join(shared), &mut newest);
    }
    newest
}

fn cargo_build_kiln(workspace: &Path) -> PathBuf {
    let mut build = escargot::CargoBuild::new()
        .manifest_path(workspace.join("Cargo.toml"))
        .package("kiln-cli")
        .bin("kiln")
        .current_release();
    // Cargo and nextest describe this test package to the test in these
    // variables. Some build scripts (ring's) watch them, so with them the
    // build would differ from the one the tests came from and rebuild half
    // the tree, twice.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let described = ["CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_MANIFEST_", "NEXTEST"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&name.as_ref());
        if described {
            build = build.env_remove(name.as_ref());
        }
    }
    build.run().expect("build the kiln binary").path().to_path_buf()
}
