//! Reaper benchmark (bench binary, `harness = false`): time from a trip to the runner being
//! gone, for a runner that obeys SIGTERM and one that ignores it (grace 1000 ms here), and
//! the time to roll back and to commit 1000 staged files.
//!
//! Run: `cargo bench -p stallwatch-reaper --bench reaper_bench`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use stallwatch_reaper::{Reaper, ReaperConfig};
use stallwatch_storage::control::{ControlRequest, RunnerSpec, SpawnSpec, Trip};
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 5;
const FILES: usize = 1000;

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<44} median {:>8.1} ms  min {:>8.1} ms  max {:>8.1} ms  (n={})",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    );
}

fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => true,
    }
}

fn spec(id: &str, script: &str) -> RunnerSpec {
    RunnerSpec {
        id: id.into(),
        heartbeat_socket: None,
        spawn: Some(SpawnSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: None,
            env: Default::default(),
            workspace: None,
        }),
        attach: None,
    }
}

fn write_files(dir: &Path) {
    for i in 0..FILES {
        let sub = dir.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(
            sub.join(format!("f{i}.json")),
            format!("{{\"i\": {i}, \"pad\": \"{}\"}}", "x".repeat(512)),
        )
        .unwrap();
    }
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
    let events = EventBus::new(storage.clone());
    let mut incidents = events.subscribe();
    let (trips, trip_rx) = mpsc::channel(16);
    let (change_tx, mut changes) = mpsc::channel(1024);
    tokio::spawn(async move { while changes.recv().await.is_some() {} });
    let mut cfg = ReaperConfig::new(dir.path());
    cfg.grace = Duration::from_millis(1000);
    cfg.restart.max_restarts = 0;
    let shutdown = CancellationToken::new();
    let (handle, task) = Reaper::start(
        cfg,
        storage.clone(),
        events,
        trip_rx,
        change_tx,
        shutdown.clone(),
    )
    .await
    .unwrap();

    for (label, script) in [
        ("trip -> gone, obeys SIGTERM", "sleep 600"),
        (
            "trip -> gone, ignores SIGTERM (grace 1000 ms)",
            "trap '' TERM; sleep 600",
        ),
    ] {
        let mut ms = Vec::new();
        for round in 0..ROUNDS {
            let id = format!(
                "bench-{}-{round}",
                ms.len() + if script.starts_with("trap") { 100 } else { 0 }
            );
            let (reply, rx) = oneshot::channel();
            handle
                .handle(ControlRequest::RegisterRunner {
                    spec: spec(&id, script),
                    reply,
                })
                .await;
            let pid = match rx.await.unwrap().unwrap() {
                stallwatch_storage::control::Registered::Spawned(r) => r.pid,
                stallwatch_storage::control::Registered::Attached(r) => r.pid,
            };
            tokio::time::sleep(Duration::from_millis(100)).await; // let the trap be installed
            let t0 = Instant::now();
            trips
                .send(Trip {
                    runner_id: id.clone(),
                    verdict: "tool_overrun".into(),
                    reason: "bench".into(),
                    incident_id: None,
                    open_spans: vec![],
                    at_unix_nano: now_unix_nano(),
                })
                .await
                .unwrap();
            while !gone(pid) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            ms.push(t0.elapsed().as_secs_f64() * 1000.0);
            loop {
                let i = incidents.recv().await.unwrap();
                if i.incident.kind == EventKind::RunnerTerminated
                    && i.incident.runner_id.as_deref() == Some(id.as_str())
                {
                    break;
                }
            }
        }
        summary(label, ms);
    }

    // Checkpoints are opened for a registered runner (stopped at shutdown).
    let (reply, rx) = oneshot::channel();
    handle
        .handle(ControlRequest::RegisterRunner {
            spec: spec("bench", "sleep 600"),
            reply,
        })
        .await;
    rx.await.unwrap().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let (mut rb, mut cm) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for commit in [false, true] {
            let (reply, rx) = oneshot::channel();
            handle
                .handle(ControlRequest::CreateCheckpoint {
                    runner_id: "bench".into(),
                    workspace: ws.path().into(),
                    reply,
                })
                .await;
            let v = rx.await.unwrap().unwrap();
            let id = v.id.clone();
            write_files(&v.path);
            let (reply, rx) = oneshot::channel();
            let t0 = Instant::now();
            if commit {
                handle
                    .handle(ControlRequest::CommitCheckpoint { id, reply })
                    .await;
            } else {
                handle
                    .handle(ControlRequest::RollbackCheckpoint { id, reply })
                    .await;
            }
            rx.await.unwrap().unwrap();
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            if commit {
                cm.push(ms)
            } else {
                rb.push(ms)
            }
        }
    }
    summary("rollback 1000 staged files", rb);
    summary(
        "commit 1000 staged files (validate+fsync+journal+rename)",
        cm,
    );
    shutdown.cancel();
    task.await.unwrap();
}
