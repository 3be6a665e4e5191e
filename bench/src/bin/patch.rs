//! A run's patch served (issue 28): `GET /v1/runs/{id}/patch` of a 5 MB
//! patch through `kiln serve` (the `kiln` binary as users run it: its
//! authentication, the ended-run check, the read, the HTTP response read
//! to its end by a keep-alive client), against the plain way to get the
//! same bytes: a prepared `SELECT patch FROM run_changes …` on a warm
//! tokio-postgres connection, the bytes read into memory.
//!
//! Warm against warm (one unmeasured request of each first), alternated
//! request by request, A B then B A. The patch is text shaped like a diff
//! (hex lines), so Postgres stores it compressed as it would a real one.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench::{Server, Summary, connect, database, drop_databases, http, kiln_binary, token};

#[derive(Parser)]
struct Args {
    /// Requests of each kind measured (p99 needs at least 20).
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// The patch's size in MB.
    #[arg(long, default_value_t = 5)]
    mb: usize,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.samples >= 20, "--samples must be at least 20 (p99 is quoted)");
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let result = run(&args, &kiln).await;
    drop_databases().await?;
    let (kiln_s, plain_s, bytes) = result?;
    println!("GET /v1/runs/{{id}}/patch of {bytes} bytes, {} serve, {} samples each:", kiln.display(), args.samples);
    println!("kiln serve   {kiln_s}");
    println!("plain SQL    {plain_s}");
    let ratio = |k: Duration, p: Duration| k.as_secs_f64() / p.as_secs_f64();
    let p50 = ratio(kiln_s.p50, plain_s.p50);
    let verdict = if p50 <= 1.5 { "met" } else { "NOT met" };
    println!("ratio p50 {p50:.3}x (goal <= 1.5: {verdict}), p99 {:.3}x", ratio(kiln_s.p99, plain_s.p99));
    Ok(())
}

async fn run(args: &Args, kiln: &std::path::Path) -> anyhow::Result<(Summary, Summary, usize)> {
    let (url, _store) = database().await?;
    let db = connect(&url).await?;
    let patch = diff_shaped(args.mb * 1024 * 1024);
    let id = insert_run_with_patch(&db, &patch).await?;
    let server = Server::kiln_serve(kiln, &url, &[]).await?;
    let client = http()?;
    let bearer = token("bench")?;
    let route = format!("http://{}/v1/runs/{id}/patch", server.addr);
    let select = db.prepare("SELECT patch FROM run_changes WHERE run_id = $1 AND scope = 'run'").await?;

    let (mut kiln_t, mut plain_t) = (vec![], vec![]);
    for i in 0..=args.samples {
        for kiln_first in [i % 2 == 0, i % 2 != 0] {
            let started = Instant::now();
            let got = if kiln_first {
                let r = client.get(&route).bearer_auth(&bearer).send().await?.error_for_status()?;
                r.bytes().await?.len()
            } else {
                let row = db.query_one(&select, &[&id]).await?;
                row.try_get::<_, Vec<u8>>(0)?.len()
            };
            let took = started.elapsed();
            anyhow::ensure!(got == patch.len(), "read {got} bytes, stored {}", patch.len());
            if i > 0 {
                if kiln_first { kiln_t.push(took) } else { plain_t.push(took) }
            }
        }
    }
    Ok((Summary::of(kiln_t), Summary::of(plain_t), patch.len()))
}

/// `len` bytes that read like a diff's added lines.
fn diff_shaped(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut line = 0u64;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(format!("+line {line}: value {x:016x} {:016x}\n", x.rotate_left(29)).as_bytes());
        line += 1;
    }
    out.truncate(len);
    out
}

/// A succeeded run of the benchmark's subject with `patch` as its change.
async fn insert_run_with_patch(db: &tokio_postgres::Client, patch: &[u8]) -> anyhow::Result<uuid::Uuid> {
    let row = db
        .query_one(
            "WITH s AS (INSERT INTO sessions (id, owner) VALUES (gen_random_uuid(), 'bench') RETURNING id)
             INSERT INTO runs (id, session_id, owner, status, prompt, finished_at)
             SELECT gen_random_uuid(), id, 'bench', 'succeeded', 'bench', now() FROM s RETURNING id",
            &[],
        )
        .await?;
    let id: uuid::Uuid = row.try_get(0)?;
    db.execute(
        "INSERT INTO run_changes (run_id, scope, files, file_count, additions, deletions, patch, patch_bytes, too_large)
         VALUES ($1, 'run', '[]', 1, 0, 0, $2, $3, false)",
        &[&id, &patch, &(patch.len() as i64)],
    )
    .await?;
    Ok(id)
}
