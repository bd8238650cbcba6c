//! Soak of issue 17's racy counts (bench binary, `harness = false`). Each count repeats a
//! race with real files and real processes and prints how often the promise broke:
//!
//! - `kill9_commit`: a child process commits 1,000 staged files and is SIGKILLed at a
//!   random moment; recovery runs as on start. Count: workspaces with neither 0 nor 1,000
//!   files, and checkpoints left `committing`.
//! - `swap_attacker`: a thread keeps swapping staged files for symlinks and hard links to an
//!   outside file during the commit. Count: symlinks or multiply-linked files in the
//!   workspace afterwards.
//! - `bystanders`: a spawned runner with a child is DELETEd next to a process of another
//!   instance (same runner id, other instance mark) and a process merely carrying the id.
//!   Count: processes signalled that were not the runner or its descendants.
//!
//! - `many_runners`: `SOAK_RUNNERS` (default 2,000) spawned `sleep 600` runners, then the
//!   ordered shutdown. Count: runners alive afterwards; the time it took.
//!
//! Run: `cargo bench -p stallwatch-reaper --bench soak [name]` (`SOAK_ROUNDS=100` by default).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_reaper::checkpoint::Checkpoints;
use stallwatch_reaper::{Reaper, ReaperConfig, ReaperStats};
use stallwatch_storage::checkpoints::CheckpointState;
use stallwatch_storage::control::{ControlRequest, RunnerSpec, SpawnSpec};
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use stallwatch_testkit::{count_files, stage_files};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const FILES: usize = 1000;

fn rounds() -> usize {
    std::env::var("SOAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn checkpoints(db: &Path) -> (Storage, Checkpoints) {
    let storage = Storage::open(StorageConfig::new(db)).unwrap();
    let cps = Checkpoints::new(
        storage.clone(),
        EventBus::new(storage.clone()),
        Arc::new(ReaperStats::default()),
    );
    (storage, cps)
}

/// Child side of `kill9_commit`: commit `SOAK_CHILD=<db>|<id>` and exit.
async fn child(arg: &str) {
    let (db, id) = arg.split_once('|').unwrap();
    let (_s, cps) = checkpoints(Path::new(db));
    let _ = cps.commit(id).await;
    std::process::exit(0);
}

async fn kill9_commit(n: usize) {
    let (mut half, mut stuck, mut moved_all, mut none) = (0, 0, 0, 0);
    let t = Instant::now();
    // Calibrate: how long one un-killed child commit takes here, so the kills spread over
    // the whole commit (start-up, validation, journal, renames) and a little beyond.
    let mut span_ms = 400u64;
    for round in 0..=n {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let (storage, cps) = checkpoints(&db);
        let c = cps.create("r", &ws).await.unwrap();
        stage_files(&c.path, FILES);
        storage.shutdown().await;
        drop(cps);
        let mut kid = std::process::Command::new(std::env::current_exe().unwrap())
            .env("SOAK_CHILD", format!("{}|{}", db.display(), c.id))
            .spawn()
            .unwrap();
        if round == 0 {
            let c0 = Instant::now();
            let _ = kid.wait();
            span_ms = (c0.elapsed().as_millis() as u64 * 3 / 2).max(50);
            println!(
                "kill9_commit: one commit takes ~{} ms; kills spread over {span_ms} ms",
                span_ms * 2 / 3
            );
            continue;
        }
        // A random moment: pseudo-random from the round and the clock.
        let ms = (round as u64 * 7919 + t.elapsed().as_micros() as u64) % span_ms;
        std::thread::sleep(Duration::from_millis(ms));
        let _ = kid.kill();
        let _ = kid.wait();
        let (storage, cps) = checkpoints(&db);
        let (_, errors) = cps.recover(64).await;
        let row = storage.checkpoint(c.id.clone()).await.unwrap().unwrap();
        let landed = count_files(&ws);
        if row.state == CheckpointState::Committing || row.state == CheckpointState::RollingBack {
            stuck += 1;
        }
        match landed {
            0 => none += 1,
            FILES => moved_all += 1,
            k => {
                half += 1;
                eprintln!(
                    "round {round}: {k} of {FILES} files, state {:?}, errors {errors:?}",
                    row.state
                );
            }
        }
        storage.shutdown().await;
    }
    println!(
        "kill9_commit: {n} rounds in {:?}: half-committed workspaces {half}, stuck in committing {stuck} (all {moved_all}, none {none})",
        t.elapsed()
    );
}

fn count_bad_entries(root: &Path) -> usize {
    let mut bad = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.strip_prefix(root).unwrap().starts_with(".workbench") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            use std::os::unix::fs::MetadataExt;
            if m.file_type().is_symlink() || (m.is_file() && m.nlink() > 1) {
                bad += 1;
            } else if m.is_dir() {
                stack.push(p);
            }
        }
    }
    bad
}

async fn swap_attacker(n: usize) {
    let (mut bad, mut committed, mut refused) = (0, 0, 0);
    let t = Instant::now();
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "secret").unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let (storage, cps) = checkpoints(&dir.path().join("db"));
        let c = cps.create("r", &ws).await.unwrap();
        stage_files(&c.path, 200);
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, staging) = (stop.clone(), c.path.clone());
        let attacker = std::thread::spawn(move || {
            let mut i = 0usize;
            while !s2.load(Ordering::Relaxed) {
                let p = staging
                    .join(format!("d{}", i % 10))
                    .join(format!("f{i}.json"));
                let tmp = staging.join(format!("d{}", i % 10)).join(format!(".x{i}"));
                let made = if i.is_multiple_of(2) {
                    std::os::unix::fs::symlink(&outside, &tmp).is_ok()
                } else {
                    std::fs::hard_link(&outside, &tmp).is_ok()
                };
                if made && std::fs::rename(&tmp, &p).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                i = (i + 37) % 200;
            }
        });
        let r = cps.commit(&c.id).await;
        stop.store(true, Ordering::Relaxed);
        attacker.join().unwrap();
        match r {
            Ok(_) => committed += 1,
            Err(_) => refused += 1,
        }
        bad += count_bad_entries(&ws);
        storage.shutdown().await;
    }
    println!(
        "swap_attacker: {n} rounds in {:?}: symlinks or hard links in the workspace {bad} (committed {committed}, refused {refused})",
        t.elapsed()
    );
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

async fn bystanders(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("db"))).unwrap();
    let events = EventBus::new(storage.clone());
    let (_trip_tx, trip_rx) = mpsc::channel(16);
    let (change_tx, mut change_rx) = mpsc::channel(1024);
    tokio::spawn(async move { while change_rx.recv().await.is_some() {} });
    let shutdown = CancellationToken::new();
    let mut cfg = ReaperConfig::new(dir.path().to_path_buf());
    cfg.grace = Duration::from_millis(300);
    cfg.restart.max_restarts = 0;
    let (handle, _task) = Reaper::start(cfg, storage, events, trip_rx, change_tx, shutdown.clone())
        .await
        .unwrap();
    let (mut wrong, mut missed) = (0, 0);
    let t = Instant::now();
    for _ in 0..n {
        // Another instance's runner of the same name, and a process carrying the name only.
        let mut other = std::process::Command::new("sh")
            .args(["-c", "sleep 600 & wait"])
            .env("STALLWATCH_RUNNER_ID", "py-tools")
            .env(
                "STALLWATCH_RUNNER_INSTANCE",
                uuid::Uuid::new_v4().to_string(),
            )
            .spawn()
            .unwrap();
        let mut named = std::process::Command::new("sleep")
            .arg("600")
            .env("STALLWATCH_RUNNER_ID", "py-tools")
            .spawn()
            .unwrap();
        let (tx, rx) = oneshot::channel();
        handle
            .handle(ControlRequest::RegisterRunner {
                spec: RunnerSpec {
                    id: "py-tools".into(),
                    heartbeat_socket: None,
                    spawn: Some(SpawnSpec {
                        argv: vec!["sh".into(), "-c".into(), "sleep 600 & wait".into()],
                        cwd: None,
                        env: Default::default(),
                        workspace: None,
                    }),
                    attach: None,
                },
                reply: tx,
            })
            .await;
        let pid = match rx.await.unwrap().unwrap() {
            stallwatch_storage::control::Registered::Spawned(r) => r.pid,
            other => panic!("expected a spawned runner, got {other:?}"),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while stallwatch_reaper::platform::descendants(pid, None).is_empty()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let kids = stallwatch_reaper::platform::descendants(pid, None);
        let (tx, rx) = oneshot::channel();
        handle
            .handle(ControlRequest::DeleteRunner {
                id: "py-tools".into(),
                reply: tx,
            })
            .await;
        rx.await.unwrap().unwrap();
        let other_kids = stallwatch_reaper::platform::descendants(other.id(), None);
        wrong += usize::from(!alive(other.id())) + usize::from(!alive(named.id()));
        wrong += other_kids.iter().filter(|k| !alive(k.pid)).count();
        missed += usize::from(alive(pid)) + kids.iter().filter(|k| alive(k.pid)).count();
        for k in &other_kids {
            let _ = std::process::Command::new("kill")
                .arg(k.pid.to_string())
                .status();
        }
        let _ = other.kill();
        let _ = other.wait();
        let _ = named.kill();
        let _ = named.wait();
    }
    shutdown.cancel();
    println!(
        "bystanders: {n} rounds in {:?}: processes signalled that were not the runner or its descendants {wrong}, runner processes left alive {missed}",
        t.elapsed()
    );
}

async fn many_runners() {
    let n: usize = std::env::var("SOAK_RUNNERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("db"))).unwrap();
    let events = EventBus::new(storage.clone());
    let (_trip_tx, trip_rx) = mpsc::channel(16);
    let (change_tx, mut change_rx) = mpsc::channel(1024);
    tokio::spawn(async move { while change_rx.recv().await.is_some() {} });
    let shutdown = CancellationToken::new();
    let mut cfg = ReaperConfig::new(dir.path().to_path_buf());
    cfg.grace = Duration::from_millis(1000);
    cfg.restart.max_restarts = 0;
    cfg.max_runners = n;
    let (handle, task) = Reaper::start(cfg, storage, events, trip_rx, change_tx, shutdown.clone())
        .await
        .unwrap();
    let t = Instant::now();
    let mut pids = Vec::new();
    for i in 0..n {
        let (tx, rx) = oneshot::channel();
        handle
            .handle(ControlRequest::RegisterRunner {
                spec: RunnerSpec {
                    id: format!("r{i}"),
                    heartbeat_socket: None,
                    spawn: Some(SpawnSpec {
                        argv: vec!["sleep".into(), "600".into()],
                        cwd: None,
                        env: Default::default(),
                        workspace: None,
                    }),
                    attach: None,
                },
                reply: tx,
            })
            .await;
        pids.push(match rx.await.unwrap().unwrap() {
            stallwatch_storage::control::Registered::Spawned(r) => r.pid,
            other => panic!("expected a spawned runner, got {other:?}"),
        });
    }
    let registered = t.elapsed();
    let t = Instant::now();
    handle.stop_spawned_runners().await;
    let took = t.elapsed();
    shutdown.cancel();
    let _ = task.await;
    let left = pids.iter().filter(|p| alive(**p)).count();
    println!(
        "many_runners: {n} registered in {registered:?}; ordered shutdown took {took:?}; runners alive after {left}"
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Ok(arg) = std::env::var("SOAK_CHILD") {
        child(&arg).await;
        return;
    }
    let n = rounds();
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if want("kill9_commit") {
        kill9_commit(n).await;
    }
    if want("swap_attacker") {
        swap_attacker(n).await;
    }
    if want("bystanders") {
        bystanders(n).await;
    }
    if want("many_runners") {
        many_runners().await;
    }
}
