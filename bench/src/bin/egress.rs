//! The egress proxy's cost: a 100 MB download from a test server through
//! Kiln's proxy against the same download straight over the test's bridge
//! network, and the time to set up a connection and fetch a small response
//! (p50/p99) both ways. Rounds alternate; the server is a container on a
//! network this benchmark creates (`kiln_tests::outside`), so no traffic
//! leaves the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kiln_protocol::egress::{EgressMode, EgressPolicy, Layers};
use kiln_tests::outside::Outside;
use kiln_worker::egress::resolve::{parse_hosts, parse_ranges};
use kiln_worker::egress::{AddressRules, EgressSettings, SessionProxy};

#[derive(Parser)]
struct Args {
    /// Bytes per download.
    #[arg(long, default_value_t = 100_000_000)]
    bytes: u64,
    /// Downloads each way.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Small requests each way, for the latency figures.
    #[arg(long, default_value_t = 300)]
    requests: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let outside = Outside::start().await;
    let open = EgressPolicy { mode: EgressMode::Open, allow: None };
    let settings = EgressSettings {
        deployment: open.clone(),
        addresses: Arc::new(AddressRules {
            allow_ranges: parse_ranges(&outside.subnet).map_err(anyhow::Error::msg)?,
            deny_ranges: Vec::new(),
            hosts: parse_hosts(&format!("server.test={}", outside.ip)).map_err(anyhow::Error::msg)?,
        }),
        ..EgressSettings::default()
    };
    let layers = Layers { deployment: open.clone(), run: Some(open) };
    let proxy = SessionProxy::start(&settings, layers, "127.0.0.1:0".parse()?, None).await?;
    // A fresh connection per request: connection set-up is what is measured.
    let client = |proxied: bool| -> anyhow::Result<reqwest::Client> {
        let builder = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(300));
        let builder = if proxied {
            builder.proxy(reqwest::Proxy::http(format!("http://{}", proxy.addr))?)
        } else {
            builder.no_proxy()
        };
        Ok(builder.build()?)
    };
    let (via_proxy, direct) = (client(true)?, client(false)?);
    let big = |host: &str| format!("http://{host}:8080/bytes/{}", args.bytes);
    let direct_host = outside.ip.to_string();

    let mut speeds = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        speeds.0.push(download(&via_proxy, &big("server.test"), args.bytes).await?);
        speeds.1.push(download(&direct, &big(&direct_host), args.bytes).await?);
    }
    let mut times = (Vec::new(), Vec::new());
    for i in 0..args.requests {
        times.0.push(small(&via_proxy, &format!("http://server.test:8080/{i}")).await?);
        times.1.push(small(&direct, &format!("http://{direct_host}:8080/{i}")).await?);
    }
    let (p, d) = (median(&mut speeds.0), median(&mut speeds.1));
    println!(
        "download {} MB: proxy {p:.0} MB/s, direct {d:.0} MB/s, ratio {:.2} (goal >= 0.8)",
        args.bytes / 1_000_000,
        p / d
    );
    for (name, samples) in [("proxy", &mut times.0), ("direct", &mut times.1)] {
        samples.sort();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        println!("connect + small GET via {name}: p50 {:?}, p99 {:?}", at(0.5), at(0.99));
    }
    drop(proxy);
    outside.stop().await;
    Ok(())
}

/// MB/s of one download.
async fn download(client: &reqwest::Client, url: &str, bytes: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut response = client.get(url).send().await?.error_for_status()?;
    let mut got = 0u64;
    while let Some(chunk) = response.chunk().await? {
        got += chunk.len() as u64;
    }
    anyhow::ensure!(got == bytes, "downloaded {got} of {bytes} bytes");
    Ok(bytes as f64 / 1e6 / start.elapsed().as_secs_f64())
}

async fn small(client: &reqwest::Client, url: &str) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let body = client.get(url).send().await?.error_for_status()?.bytes().await.context("small response")?;
    anyhow::ensure!(body.starts_with(b"outside says"), "unexpected answer");
    Ok(start.elapsed())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
