//! Where a session start's time goes: the steps of `Sandbox::start` and of
//! taking a warm container, done one by one through the same Docker API
//! calls (bollard) with the same container settings, each timed.
//!
//! A breakdown, not a comparison: it has no baseline and no ratio (the
//! comparison with the plain way is `session_start`'s).
//!
//! Cold: create, start, copy the toolbox in (archive API), start it and wait
//! for its hello, first `bash true`; also the copy done before the start and
//! the copy done while the container starts. Warm: the lookup of the
//! session's own container (a 404 for a new session), the rename that binds
//! a warm container to the session, and the first `bash true`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use bollard::Docker;
use bollard::query_parameters::{RenameContainerOptionsBuilder, UploadToContainerOptionsBuilder};
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_toolbox::protocol::{ExecRequest, Reply, RequestBody};
use kiln_worker::sandbox::toolbox::ToolboxConn;
use kiln_worker::sandbox::{Backend, SandboxConfig};
use uuid::Uuid;

const TOOLBOX_IN_CONTAINER: &str = "/usr/local/libexec/kiln/kiln-toolbox";

#[derive(Parser)]
#[command(about = "Breakdown of a sandbox start (cold and warm), step by step")]
struct Args {
    #[command(flatten)]
    common: Common,
}

#[derive(Default)]
struct Steps(Vec<(&'static str, Vec<Duration>)>);

impl Steps {
    fn add(&mut self, name: &'static str, took: Duration) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(took),
            None => self.0.push((name, vec![took])),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let toolbox_path = config.toolbox_path.clone().context("no toolbox path")?;
    let tarball = toolbox_tarball(&toolbox_path)?;
    let docker = setup::docker().await?;
    let worker = setup::owner().worker;
    let mut steps = Steps::default();
    for rep in 0..=args.common.runs {
        let mut s = Steps::default();
        cold(&docker, &config, &worker, &tarball, &mut s).await?;
        copy_first(&docker, &config, &worker, &tarball, &mut s).await?;
        copy_while_starting(&docker, &config, &worker, &tarball, &mut s).await?;
        warm(&docker, &config, &worker, &tarball, &mut s).await?;
        if rep > 0 {
            for (name, v) in s.0 {
                for d in v {
                    steps.add(name, d);
                }
            }
        }
    }
    println!("sandbox start, step by step (toolbox {} bytes, image {}):", tarball.len(), args.common.image);
    for (name, v) in &steps.0 {
        stats::report(name, v);
    }
    Ok(())
}

/// `Sandbox::start`'s order: create, start, copy, toolbox, first command.
async fn cold(d: &Docker, c: &SandboxConfig, w: &str, tar: &[u8], s: &mut Steps) -> anyhow::Result<()> {
    let total = Instant::now();
    let t = Instant::now();
    let id = setup::create_like_kiln(d, c, w, &["sleep", "infinity"]).await?;
    s.add("cold: create", t.elapsed());
    let t = Instant::now();
    d.start_container(&id, None).await?;
    s.add("cold: start", t.elapsed());
    let t = Instant::now();
    upload(d, &id, tar).await?;
    s.add("cold: copy toolbox in (archive API)", t.elapsed());
    let t = Instant::now();
    let conn = ToolboxConn::start(&Backend::from(d), &id, TOOLBOX_IN_CONTAINER, &c.user).await?;
    s.add("cold: toolbox exec + hello", t.elapsed());
    let t = Instant::now();
    bash_true(&conn).await?;
    s.add("cold: first bash true", t.elapsed());
    s.add("cold: total", total.elapsed());
    drop(conn);
    setup::remove_container(d, &id).await;
    Ok(())
}

/// The copy into the created container, before it starts.
async fn copy_first(d: &Docker, c: &SandboxConfig, w: &str, tar: &[u8], s: &mut Steps) -> anyhow::Result<()> {
    let total = Instant::now();
    let id = setup::create_like_kiln(d, c, w, &["sleep", "infinity"]).await?;
    let t = Instant::now();
    upload(d, &id, tar).await?;
    s.add("copy first: copy into created container", t.elapsed());
    let t = Instant::now();
    d.start_container(&id, None).await?;
    s.add("copy first: start", t.elapsed());
    let conn = ToolboxConn::start(&Backend::from(d), &id, TOOLBOX_IN_CONTAINER, &c.user).await?;
    bash_true(&conn).await?;
    s.add("copy first: total", total.elapsed());
    drop(conn);
    setup::remove_container(d, &id).await;
    Ok(())
}

/// The copy and the start at once.
async fn copy_while_starting(d: &Docker, c: &SandboxConfig, w: &str, tar: &[u8], s: &mut Steps) -> anyhow::Result<()> {
    let total = Instant::now();
    let id = setup::create_like_kiln(d, c, w, &["sleep", "infinity"]).await?;
    let t = Instant::now();
    let (started, copied) = tokio::join!(d.start_container(&id, None), upload(d, &id, tar));
    started?;
    copied?;
    s.add("concurrent: start || copy", t.elapsed());
    let conn = ToolboxConn::start(&Backend::from(d), &id, TOOLBOX_IN_CONTAINER, &c.user).await?;
    bash_true(&conn).await?;
    s.add("concurrent: total", total.elapsed());
    drop(conn);
    setup::remove_container(d, &id).await;
    Ok(())
}

/// A ready container (started, toolbox up) taken for a new session.
async fn warm(d: &Docker, c: &SandboxConfig, w: &str, tar: &[u8], s: &mut Steps) -> anyhow::Result<()> {
    let id = setup::create_like_kiln(d, c, w, &["sleep", "infinity"]).await?;
    d.start_container(&id, None).await?;
    upload(d, &id, tar).await?;
    let conn = ToolboxConn::start(&Backend::from(d), &id, TOOLBOX_IN_CONTAINER, &c.user).await?;
    let session = format!("kiln-session-{}", Uuid::new_v4().simple());
    let total = Instant::now();
    let t = Instant::now();
    let missing = d.inspect_container(&session, None).await;
    s.add("warm: look up the session's container (404)", t.elapsed());
    anyhow::ensure!(missing.is_err(), "a new session already has a container");
    let t = Instant::now();
    d.rename_container(&id, RenameContainerOptionsBuilder::new().name(&session).build()).await?;
    s.add("warm: rename to the session's name", t.elapsed());
    let t = Instant::now();
    bash_true(&conn).await?;
    s.add("warm: first bash true", t.elapsed());
    s.add("warm: total", total.elapsed());
    drop(conn);
    setup::remove_container(d, &id).await;
    Ok(())
}

async fn bash_true(conn: &ToolboxConn) -> anyhow::Result<()> {
    match conn.call(RequestBody::Exec(ExecRequest::new("true")), None).await? {
        Reply::Exec(r) if r.exit_code == Some(0) => Ok(()),
        other => anyhow::bail!("bash true: {other:?}"),
    }
}

async fn upload(d: &Docker, id: &str, tar: &[u8]) -> Result<(), bollard::errors::Error> {
    let options = UploadToContainerOptionsBuilder::new().path("/").build();
    d.upload_to_container(id, Some(options), bollard::body_full(tar.to_vec().into())).await
}

/// The toolbox at its in-container path, with its directories, as a tarball.
fn toolbox_tarball(binary: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let mut builder = tar::Builder::new(Vec::new());
    let rel = TOOLBOX_IN_CONTAINER.trim_start_matches('/');
    for dir in ["usr", "usr/local", "usr/local/libexec", "usr/local/libexec/kiln"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o755);
    header.set_size(bytes.len() as u64);
    builder.append_data(&mut header, rel, bytes.as_slice())?;
    Ok(builder.into_inner()?)
}
