//! Crash safety: every span acknowledged to an exporter survives `kill -9` of stallwatch,
//! and the database stays consistent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;

use crate::spine::rich_request;
use crate::support::*;

/// A raw OTLP/HTTP client that sends distinct traces as fast as it can and logs each one
/// acknowledged with 200.
fn blast(url: String, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<[u8; 16]>>>, seed: u64) {
    let client = http_client();
    let mut n = seed << 32;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let mut tid = [0u8; 16];
        tid[..8].copy_from_slice(&n.to_be_bytes());
        tid[15] = 1;
        let body = rich_request(tid, "crash").encode_to_vec();
        match client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
        {
            Ok(r) if r.status() == 200 => acked.lock().unwrap().push(tid),
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[test]
fn acknowledged_spans_survive_repeated_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let acked = Arc::new(Mutex::new(Vec::new()));
    for round in 0..4u64 {
        let server = Server::start(&data);
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (url, stop, acked) =
                    (server.otlp_http("/v1/traces"), stop.clone(), acked.clone());
                std::thread::spawn(move || blast(url, stop, acked, round * 10 + w + 1))
            })
            .collect();
        // Let it take load, then kill -9 in the middle of it.
        let before = acked.lock().unwrap().len();
        wait_until!(
            Duration::from_secs(30),
            "acknowledged exports",
            acked.lock().unwrap().len() >= before + 20
        );
        std::thread::sleep(Duration::from_millis(37 * (round + 1)));
        server.crash();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
    }
    let acked: Vec<[u8; 16]> = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 80,
        "too few acknowledged exports to prove anything: {}",
        acked.len()
    );
    let server = Server::start(&data);
    let mut missing = HashSet::new();
    for tid in &acked {
        let hex = hex::encode(tid);
        let (st, trace) = server.get_json(&format!("/api/v1/traces/{hex}"));
        if st != 200 || trace["spans"].as_array().map(|a| a.len()) != Some(2) {
            missing.insert(hex);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged traces lost: {:?}",
        missing.len(),
        acked.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(server.stop(), Some(0));
    let conn = rusqlite::Connection::open(data.join("stallwatch.db")).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// An outside connection to the live database (a user's `sqlite3`, a backup tool) breaks
/// nothing. stallwatch used to open and close its own descriptors of the database, `-wal`
/// and `-shm` after SQLite's connections were open (to set their mode), which on Unix drops
/// every POSIX lock the process holds on them: the next outside connection believed it was
/// alone, truncated the shared memory (stallwatch died of SIGBUS) or checkpointed and
/// deleted the WAL under the writer (acknowledged exports gone after a kill -9). Found by
/// an outside-style round with `sqlite3` on the live file.
#[test]
fn an_outside_connection_to_the_live_database_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let client = http_client();
    let url = server.otlp_http("/v1/traces");
    let mut acked = Vec::new();
    for round in 0..6u64 {
        for i in 0..15u64 {
            let mut tid = [0u8; 16];
            tid[..8].copy_from_slice(&(round * 1000 + i + 1).to_be_bytes());
            tid[15] = 7;
            let r = client
                .post(&url)
                .header("content-type", "application/x-protobuf")
                .body(rich_request(tid, "outside").encode_to_vec())
                .send()
                .unwrap_or_else(|e| panic!("round {round}: stallwatch gone: {e}"));
            assert_eq!(r.status(), 200, "round {round}");
            acked.push(tid);
        }
        // The outside connection: read-write (as `sqlite3` opens by default), a query, closed.
        let conn = rusqlite::Connection::open(data.join("stallwatch.db")).unwrap();
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert!(tables > 0);
        drop(conn);
        for suffix in ["-wal", "-shm"] {
            let p = data.join(format!("stallwatch.db{suffix}"));
            assert!(
                p.exists(),
                "round {round}: {} deleted under stallwatch",
                p.display()
            );
        }
    }
    server.crash();
    let server = Server::start(&data);
    let lost: Vec<String> = acked
        .iter()
        .map(hex::encode)
        .filter(|hex| {
            let (st, trace) = server.get_json(&format!("/api/v1/traces/{hex}"));
            st != 200 || trace["spans"].as_array().map(|a| a.len()) != Some(2)
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged traces lost: {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
    assert_eq!(server.stop(), Some(0));
}

/// Regression (found by the crash harness): after a kill -9, a `[[runner]]` config runner
/// and the orphan sweep raced over the same id: start-up failed with `runner_exists`, or
/// the previous run's process was left running untracked.
#[test]
fn config_runner_left_by_a_crash_is_settled_not_duplicated() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = "[[runner]]\nid = \"sleeper\"\nspawn = { argv = [\"sleep\", \"600\"] }\n";
    let mut previous: Vec<u64> = Vec::new();
    for round in 0..3 {
        let server = Server::start_with(ServerOpts::new(&data).config(cfg));
        let mut pid;
        wait_until!(Duration::from_secs(20), "the sleeper's pid", {
            pid = server.get_json("/api/v1/runners/sleeper").1["pid"].as_u64();
            pid.is_some_and(|p| !previous.contains(&p))
        });
        // Every process of earlier rounds is gone: stopped in order, not left running.
        for old in &previous {
            wait_until!(
                Duration::from_secs(20),
                format!("round {round}: old sleeper {old} stopped"),
                !crate::chain::process_alive(*old)
            );
        }
        previous.push(pid.unwrap());
        server.crash();
    }
    // The last one, left by the final crash, is settled by the next start, then stopped in order.
    let server = Server::start_with(ServerOpts::new(&data).config(cfg));
    let last = *previous.last().unwrap();
    wait_until!(
        Duration::from_secs(20),
        "the last crashed run's sleeper stopped",
        !crate::chain::process_alive(last)
    );
    assert_eq!(server.stop(), Some(0));
}
