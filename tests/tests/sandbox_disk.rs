//! The sandbox's disk bound, under every mechanism this engine supports
//! (issues 30 and 33): each test forces `KILN_SANDBOX_DISK_MODE` and asserts
//! which mechanism ran (the probe's plan, shared with the worker's copy of
//! the config), and says which were not run here and why.
//!
//! - A write past the bound gets ENOSPC, and the host loses no more than the
//!   bound (the engine's data root and the loop disks' directory both).
//! - A gigabyte in the workspace costs the sandbox's memory cgroup a
//!   gigabyte of unreclaimable RAM under tmpfs (the negative control), and
//!   next to none under loop.
//! - A loop disk is freed (unmounted, loop device detached, file deleted)
//!   when Kiln removes its container, and a leftover whose container is
//!   gone (a crashed worker) is swept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, outcome, pick};
use kiln_worker::sandbox::disk::{DiskMechanism, DiskMode};
use kiln_worker::sandbox::{Owner, Sandbox, SandboxConfig, loop_disk};
use serde_json::json;
use uuid::Uuid;

fn bash(command: &str) -> Reply {
    Reply::tool("bash", json!({ "command": command }))
}

fn results(events: &[Event]) -> Vec<(String, bool)> {
    pick!(events, EventBody::ToolResult { output, is_error, .. } => (output.clone(), *is_error)).collect()
}

/// A directory of loop disks for one test, so its sweeps touch no other
/// test's disks.
fn disk_dir() -> PathBuf {
    std::env::temp_dir().join(format!("kiln-disk-test-{}", Uuid::new_v4().simple()))
}

fn sandbox_config(mode: DiskMode, dir: &Path) -> SandboxConfig {
    let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10)).sandbox;
    config.disk_mode = mode;
    config.disk_dir = dir.to_owned();
    config
}

/// Whether this machine must support the loop mechanism: the tests run as
/// root next to the engine (its socket is local) with loop devices, as in CI.
fn loop_expected() -> bool {
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&uid.stdout).trim() == "0"
        && Path::new("/dev/loop-control").exists()
        && std::env::var("DOCKER_HOST").map_or(true, |h| h.starts_with("unix://"))
}

/// The mechanism `mode` gets on this engine; `None` (said on stderr):
/// not supported here, so not run. Loop is required where [`loop_expected`].
async fn supported(mode: DiskMode) -> Option<DiskMechanism> {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let dir = disk_dir();
    let plan = sandbox_config(mode, &dir).disk_plan(&docker).await.map(|p| p.mechanism);
    let _ = std::fs::remove_dir(&dir);
    match plan {
        Ok(mechanism) => Some(mechanism),
        Err(e) if mode == DiskMode::Layer => {
            eprintln!("disk mechanism layer: not supported by this engine, not run: {e}");
            None
        }
        Err(e) if mode == DiskMode::Loop && !loop_expected() => {
            eprintln!("disk mechanism loop: not possible here (not root next to the engine), not run: {e}");
            None
        }
        Err(e) => panic!("{mode:?} is not supported here: {e}"),
    }
}

/// Free bytes of the filesystem holding `path`, and its device.
fn free_space(path: &Path) -> (String, u64) {
    let out = std::process::Command::new("df").args(["-B1", "--output=source,avail"]).arg(path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut line = text.lines().nth(1).unwrap().split_whitespace();
    (line.next().unwrap().to_owned(), line.next().unwrap().parse().unwrap())
}

/// Free space of the engine's data root and of the disk directory (once
/// if they share a filesystem).
async fn host_free(dir: &Path) -> Vec<(String, u64)> {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let root = docker.info().await.unwrap().docker_root_dir.unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut all = vec![free_space(Path::new(&root)), free_space(dir)];
    all.dedup_by(|a, b| a.0 == b.0);
    all
}

/// The disks under `dir`, and whether anything of them is left on the
/// host: a mount under `dir`, a loop device backed by a file under it.
async fn leftovers(dir: &Path) -> Vec<String> {
    let mut left: Vec<String> = loop_disk::list(dir).await.iter().map(|d| d.display().to_string()).collect();
    let prefix = dir.to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(mounts.lines().filter(|l| l.contains(&prefix)).map(|l| format!("mount: {l}")));
    let loops = std::process::Command::new("losetup").arg("-a").output().unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout).into_owned();
    left.extend(loops.lines().filter(|l| l.contains(&prefix)).map(|l| format!("loop device: {l}")));
    left
}

async fn disk_bound_holds(mode: DiskMode) {
    let Some(expected) = supported(mode).await else { return };
    // A 64 MiB bound; the container stays after the run, with whatever it
    // managed to write, while the host's free space is measured.
    const FILL: &str = "fallocate -l 2G /workspace/big; \
        for f in /workspace/fill \"$HOME/fill\" /var/tmp/fill; do dd if=/dev/zero of=$f bs=1M count=300 2>&1 | head -1; done; \
        echo filled";
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            bash(FILL),
            // (`big` too: ext4 keeps what a failed fallocate allocated.)
            bash("rm -f /workspace/fill /workspace/big && echo ok > /workspace/after && cat /workspace/after"),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let dir = disk_dir();
    let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox = SandboxConfig { disk_mb: 64, ..sandbox_config(mode, &dir) };
    config.sandbox_idle = Duration::from_secs(600);
    // The worker's clones share the plan: it says which mechanism ran.
    let sandbox = config.sandbox.clone();
    app.start_worker(config).await;
    let free_before = host_free(&dir).await;
    let id = app.submit("alice", CreateRun::new("fill the disk")).await.id;
    let events = app.events("alice", id).await;
    let free_after = host_free(&dir).await;
    let disks_while_running = loop_disk::list(&dir).await.len();
    let containers = app.containers_of(id).await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    // Removed behind Kiln's back, as a crashed worker's would be: the
    // sweep must find the loop disk left behind.
    for c in &containers {
        let options = bollard::query_parameters::RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        docker.remove_container(c, Some(options)).await.unwrap();
    }
    let swept = loop_disk::sweep(&docker, &dir, Duration::ZERO).await;
    let left = leftovers(&dir).await;
    let _ = std::fs::remove_dir(&dir);
    let ran = sandbox.disk_plan.get().expect("the worker probed the engine").mechanism;
    eprintln!("disk mechanism {}: ran (asked for {mode:?})", ran.as_str());
    assert_eq!(ran, expected);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    // The run's `sandbox.ready` says which mechanism bounds its disk.
    let said = pick!(&events, EventBody::SandboxReady { disk, .. } => disk.clone()).next().flatten();
    assert_eq!(said.as_deref(), Some(ran.as_str()), "sandbox.ready's disk");
    assert_eq!(containers.len(), 1, "the session's container stayed for the measurement");
    let r = results(&events);
    let fill = &r[0].0;
    assert!(fill.contains("fallocate failed: No space left on device"), "{fill}");
    assert!(fill.contains("error writing '/workspace/fill': No space left on device"), "{fill}");
    assert!(fill.contains("/fill': No space left on device") && fill.contains("kiln/fill'"), "the home: {fill}");
    // The root filesystem (here its world-writable /var/tmp) is read-only
    // (tmpfs and loop) or shares the bound (layer): either way it cannot grow.
    let line = fill.lines().find(|l| l.contains("'/var/tmp/fill'")).unwrap_or_else(|| panic!("{fill}"));
    assert!(line.contains("Read-only file system") || line.contains("No space left on device"), "{line}");
    // The session works on: freed space can be written again.
    assert!(!r[1].1 && r[1].0.trim() == "ok", "{:?}", r[1]);
    // Tried: 2 GiB + 4 × 300 MiB. Allowed: the bound, plus slack for
    // whatever else runs on this machine meanwhile.
    for ((device, before), (_, after)) in free_before.iter().zip(&free_after) {
        let lost = before.saturating_sub(*after);
        assert!(lost < 1024 * 1024 * 1024, "{device} lost {} MiB to a 64 MiB sandbox", lost >> 20);
    }
    if ran == DiskMechanism::Loop {
        assert_eq!(disks_while_running, 1, "one loop disk for the session's sandbox");
        assert_eq!(swept, 1, "the sweep freed the disk of the removed container");
    }
    assert!(left.is_empty(), "left on the host: {left:?}");
}

#[tokio::test]
async fn writing_past_the_disk_bound_fails_with_enospc_and_the_host_keeps_its_disk_under_layer() {
    disk_bound_holds(DiskMode::Layer).await;
}

#[tokio::test]
async fn writing_past_the_disk_bound_fails_with_enospc_and_the_host_keeps_its_disk_under_loop() {
    disk_bound_holds(DiskMode::Loop).await;
}

#[tokio::test]
async fn writing_past_the_disk_bound_fails_with_enospc_and_the_host_keeps_its_disk_under_tmpfs() {
    disk_bound_holds(DiskMode::Tmpfs).await;
}

fn owner() -> Owner {
    Owner { run_id: Uuid::new_v4(), session_id: Uuid::new_v4(), worker: format!("test-{}", Uuid::new_v4().simple()) }
}

/// Runs `command` in the sandbox as its command user.
async fn exec(sandbox: &Sandbox, command: &str) -> String {
    let (code, out) = kiln_tests::docker_exec(
        sandbox.id(),
        &["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "sh", "-c", command],
    )
    .await;
    assert_eq!(code, 0, "{command}: {out}");
    out
}

/// A `memory.stat` field of a container's memory cgroup (cgroup v1, as
/// Docker's cgroupfs driver lays it out), or of the container's view.
fn cgroup_value(id: &str, file: &str, field: Option<&str>) -> u64 {
    let path = format!("/sys/fs/cgroup/memory/docker/{id}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value = match field {
        None => text.trim(),
        Some(field) => text
            .lines()
            .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{field} in {path}")),
    };
    value.trim().parse().unwrap()
}

/// A gigabyte written into the workspace of a sandbox with 512 MiB of
/// memory: (RAM the cgroup cannot give back — rss + shmem — and its
/// memory limit), in MiB.
async fn memory_of_a_gigabyte_workspace(mode: DiskMode) -> (u64, u64) {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let dir = disk_dir();
    let config = SandboxConfig { disk_mb: 1400, memory_bytes: 512 << 20, ..sandbox_config(mode, &dir) };
    let sandbox = Sandbox::start(&docker, &config, &owner()).await.unwrap();
    let measured = async {
        exec(&sandbox, "dd if=/dev/zero of=/workspace/big bs=1M count=1024 2>&1 | tail -1 && sync").await;
        let id = docker.inspect_container(sandbox.id(), None).await.unwrap().id.unwrap();
        let pinned =
            cgroup_value(&id, "memory.stat", Some("total_rss")) + cgroup_value(&id, "memory.stat", Some("total_shmem"));
        (pinned >> 20, cgroup_value(&id, "memory.limit_in_bytes", None) >> 20)
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(measured)).await;
    sandbox.remove().await;
    let _ = std::fs::remove_dir(&dir);
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

#[tokio::test]
async fn a_gigabyte_workspace_pins_a_gigabyte_of_ram_under_tmpfs_and_next_to_none_under_loop() {
    if supported(DiskMode::Loop).await.is_none() {
        return;
    }
    let (tmpfs_pinned, tmpfs_limit) = memory_of_a_gigabyte_workspace(DiskMode::Tmpfs).await;
    let (loop_pinned, loop_limit) = memory_of_a_gigabyte_workspace(DiskMode::Loop).await;
    eprintln!(
        "1 GiB workspace: tmpfs pins {tmpfs_pinned} MiB (limit {tmpfs_limit} MiB), \
         loop pins {loop_pinned} MiB (limit {loop_limit} MiB)"
    );
    // The negative control: on tmpfs the gigabyte is the container's RAM,
    // and its memory limit was raised to hold it.
    assert!(tmpfs_pinned >= 1000, "tmpfs pinned {tmpfs_pinned} MiB");
    assert!(tmpfs_limit > 1400, "tmpfs limit {tmpfs_limit} MiB");
    // On the loop disk it is page cache, given back under pressure: the
    // gigabyte fits a sandbox whose whole memory limit is smaller.
    assert!(loop_pinned < 100, "loop pinned {loop_pinned} MiB");
    assert!(loop_limit < 1024, "loop limit {loop_limit} MiB");
}

#[tokio::test]
async fn removing_a_sandbox_frees_its_loop_disk_and_a_crashed_workers_leftover_is_swept() {
    if supported(DiskMode::Loop).await.is_none() {
        return;
    }
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let dir = disk_dir();
    let config = sandbox_config(DiskMode::Loop, &dir);
    let session = Sandbox::start(&docker, &config, &owner()).await.unwrap();
    let warm = Sandbox::start_warm(&docker, &config, &owner().worker).await.unwrap();
    let checked =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(disk_per_sandbox(&session, &dir))).await;
    session.remove().await;
    warm.remove().await;
    if let Err(panic) = checked {
        loop_disk::sweep(&docker, &dir, Duration::ZERO).await;
        std::panic::resume_unwind(panic);
    }
    assert_eq!(leftovers(&dir).await, Vec::<String>::new(), "removal freed both disks");

    // A crashed worker's leftover: a disk made, its container never made
    // (or removed without Kiln). Young ones are spared (a container may be
    // on its way), old ones freed.
    let left = loop_disk::create(&dir, 16, (1000, 1000), &[("/workspace", 0o755)]).await.unwrap();
    assert!(loop_disk::is_mounted(&left.mount_point()).await);
    assert_eq!(loop_disk::sweep(&docker, &dir, Duration::from_secs(3600)).await, 0);
    assert_eq!(loop_disk::sweep(&docker, &dir, Duration::ZERO).await, 1);
    assert_eq!(leftovers(&dir).await, Vec::<String>::new(), "the sweep freed the leftover");
    std::fs::remove_dir(&dir).unwrap();
}

/// Each of the two sandboxes has a mounted disk of its own, and the
/// session's workspace is on it.
async fn disk_per_sandbox(session: &Sandbox, dir: &Path) {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let disks = loop_disk::list(dir).await;
    assert_eq!(disks.len(), 2, "one disk per sandbox: {disks:?}");
    for disk in &disks {
        assert!(loop_disk::is_mounted(&disk.join("mnt")).await, "{} is mounted", disk.display());
    }
    // The workspace is the disk: a filesystem of the bound's size (1 GiB
    // less ext4's own), a loop device where the runtime shows the source
    // (gVisor shows `none`).
    let df = exec(session, "df -P -k /workspace | tail -1").await;
    let kib: u64 = df.split_whitespace().nth(1).and_then(|k| k.parse().ok()).unwrap_or_else(|| panic!("{df}"));
    assert!((900 * 1024..=1024 * 1024).contains(&kib), "the workspace is the 1 GiB disk: {df}");
    assert!(df.starts_with("/dev/loop") || kiln_tests::sandbox_runtime().is_some(), "on a loop device: {df}");
    // A disk whose container lives is not swept, however old.
    assert_eq!(loop_disk::sweep(&docker, dir, Duration::ZERO).await, 0);
}
