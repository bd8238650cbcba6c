//! Bench binary: latency of the calls a Tauri backend makes on its hot path, against a real
//! `stallwatch serve` started with [`Sidecar::spawn`]: time to ready, `admit()` (called
//! before every MCP request) and a checkpoint create + commit round.
//!
//! Run: `STALLWATCH_BIN=target/release/stallwatch cargo bench -p stallwatch-client --bench admit`
//! (without `STALLWATCH_BIN` it prints how to run and exits).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stallwatch_client::{Sidecar, SidecarOptions};

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    println!(
        "{name:<28} n={:<5} p50={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        v.len(),
        p(0.5),
        p(0.99),
        v[v.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(bin) = std::env::var_os("STALLWATCH_BIN") else {
        eprintln!("set STALLWATCH_BIN to the stallwatch binary to run this bench");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut spawns = Vec::new();
    for i in 0..5 {
        let mut o = SidecarOptions::new(&bin);
        o.data_dir = Some(dir.path().join(format!("data{i}")));
        o.stderr_file = Some(dir.path().join("stderr.log"));
        let t = Instant::now();
        let sc = Sidecar::spawn(o).await.unwrap();
        spawns.push(t.elapsed());
        sc.shutdown().await.unwrap();
    }
    summary("spawn to ready (fresh dir)", spawns);

    let mut o = SidecarOptions::new(&bin);
    o.data_dir = Some(dir.path().join("data"));
    o.stderr_file = Some(dir.path().join("stderr.log"));
    let sc = Sidecar::spawn(o).await.unwrap();
    let client = sc.client().clone();
    let mut sleeper = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    client
        .attach_runner("bench", sleeper.id(), None)
        .await
        .unwrap();
    while !client
        .admit("bench")
        .await
        .map(|a| a.admit)
        .unwrap_or(false)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut admits = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        let a = client.admit("bench").await.unwrap();
        admits.push(t.elapsed());
        assert!(a.admit);
    }
    summary("admit()", admits);

    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let mut rounds = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        let cp = client.create_checkpoint("bench", &ws).await.unwrap();
        std::fs::write(cp.path.join(format!("f{i}.txt")), b"x").unwrap();
        client.commit_checkpoint(&cp.id).await.unwrap();
        rounds.push(t.elapsed());
    }
    summary("checkpoint create+commit", rounds);

    client.delete_runner("bench").await.unwrap();
    let _ = sleeper.wait();
    sc.shutdown().await.unwrap();
}
