//! Outside faults (issue 11, issue 17 points 12–15), each against the real binary: another
//! process holding the SQLite write lock while real SDK exporters send, a foreign schema
//! version, the database deleted while running.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// Holds `BEGIN IMMEDIATE` on `db` from a separate process (python's sqlite3) for `secs`
/// seconds; returns once the lock is taken.
fn hold_write_lock(db: &std::path::Path, secs: f64) -> std::process::Child {
    let script = format!(
        "import sqlite3,sys,time\nc=sqlite3.connect({db:?}, isolation_level=None, timeout=30)\n\
         c.execute('BEGIN IMMEDIATE')\nprint('locked', flush=True)\ntime.sleep({secs})\n\
         c.execute('ROLLBACK')\nprint('released', flush=True)\n",
        db = db.display().to_string()
    );
    let mut child = Command::new(python())
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python sqlite3 lock holder");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked", "lock holder did not take the lock");
    child
}

fn export_under_fault(
    protocol: &'static str,
    endpoint: String,
    count: u32,
) -> std::thread::JoinHandle<serde_json::Value> {
    std::thread::spawn(move || {
        let out = Command::new(python())
            .arg(test_data("python/export_under_fault.py"))
            .args([protocol, &endpoint, &count.to_string(), "0.4"])
            .output()
            .expect("run python exporter");
        assert!(
            out.status.success(),
            "python exporter ({protocol}) failed (is the venv installed?):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    })
}

fn metric(server: &Server, line_prefix: &str) -> u64 {
    let text = http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric line {line_prefix} in /metrics"))
}

fn stored(server: &Server, trace_id: &str, span_id: &str) -> bool {
    let (status, body) = server.get_json(&format!("/api/v1/traces/{trace_id}"));
    status == 200
        && body["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["span_id"] == span_id))
}

/// Regression (issue 11, "another process holding the SQLite lock"): every export waited the
/// busy timeout and got HTTP 500 / gRPC INTERNAL, which exporters never retry: data lost.
/// Now: 503 + Retry-After / UNAVAILABLE + RetryInfo, counted, `/readyz` degraded, and the
/// SDKs' retries succeed once the lock is released: every span the SDK was told was
/// accepted is stored, and none was refused.
#[test]
fn sqlite_lock_held_by_another_process_is_retryable_on_both_transports() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let db = server.data_dir.join("stallwatch.db");

    let lock = hold_write_lock(&db, 8.0);
    let locked_at = Instant::now();
    let http = export_under_fault("http/protobuf", format!("http://{}", server.http), 8);
    let grpc = export_under_fault("grpc", format!("http://{}", server.grpc), 8);

    // While the lock is held, /readyz says degraded (still 200: runners are watched).
    wait_until!(Duration::from_secs(15), "readyz degraded=busy", {
        let (status, body) = server.get_json("/readyz");
        assert_eq!(status, 200, "{body}");
        body["degraded"]["condition"] == "busy"
    });
    assert!(
        locked_at.elapsed() < Duration::from_secs(8),
        "degraded was noticed only after the lock was released"
    );

    let http = http.join().unwrap();
    let grpc = grpc.join().unwrap();
    let status = lock.wait_with_output().unwrap();
    assert!(status.status.success());

    for (name, out) in [("http", &http), ("grpc", &grpc)] {
        assert_eq!(
            out["refused"].as_array().unwrap().len(),
            0,
            "{name}: the SDK gave up on spans (its retries did not succeed): {out}\n{}",
            server.stderr()
        );
        let accepted = out["accepted"].as_array().unwrap();
        assert_eq!(accepted.len(), 8, "{name}: {out}");
        for ids in accepted {
            let (t, s) = (
                ids["trace_id"].as_str().unwrap(),
                ids["span_id"].as_str().unwrap(),
            );
            assert!(
                stored(&server, t, s),
                "{name}: span {t}/{s} acknowledged but not stored"
            );
        }
    }
    // Counted by reason, on the storage writer and on the collector.
    assert!(
        metric(
            &server,
            "stallwatch_storage_writes_refused_total{reason=\"storage_busy\"}"
        ) > 0
    );
    let stderr = server.stderr();
    assert!(!stderr.contains("telemetry commit failed"), "{stderr}");
    assert!(stderr.contains("storage degraded"), "{stderr}");
    // The writer recovers by itself.
    wait_until!(Duration::from_secs(10), "readyz degraded cleared", {
        server.get_json("/readyz").1["degraded"].is_null()
    });
}

/// Regression (issue 17 point 15): a database with `user_version = -5` got a raw SQL error;
/// now start fails with the clear "schema from another version" message and the file is
/// left untouched (not switched to WAL).
#[test]
fn foreign_schema_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let db = data.join("stallwatch.db");
    let st = Command::new(python())
        .args([
            "-c",
            &format!(
                "import sqlite3\nc=sqlite3.connect({:?})\nc.execute('CREATE TABLE t(x)')\n\
                 c.execute('PRAGMA user_version = -5')\nc.commit()\n",
                db.display().to_string()
            ),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new(bin())
        .args(["serve", "--data-dir"])
        .arg(&data)
        .args(["--otlp-grpc-listen", "127.0.0.1:0"])
        .args(["--otlp-http-listen", "127.0.0.1:0"])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .env_remove("STALLWATCH_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("schema from another version") && stderr.contains("user_version -5"),
        "{stderr}"
    );
    assert!(
        !data.join("stallwatch.db-wal").exists(),
        "the foreign file was switched to WAL"
    );
}

/// Issue 17 point 12: the data folder deleted while running. Ingest answered 200 into the
/// unlinked database; now it answers 503 (`storage_gone`), says so loudly, and `/readyz`
/// reports `degraded.condition = "gone"`.
#[test]
fn deleted_database_stops_acknowledging() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let post = || {
        http_client()
            .post(server.otlp_http("/v1/traces"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap()
    };
    assert_eq!(post().status().as_u16(), 200);
    std::fs::remove_dir_all(&server.data_dir).unwrap();
    let r = post();
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().get("retry-after").is_some());
    let text = r.text().unwrap();
    assert!(text.contains("deleted"), "{text}");
    let (_, ready) = server.get_json("/readyz");
    assert_eq!(ready["degraded"]["condition"], "gone", "{ready}");
    let stderr = server.stderr();
    assert!(
        stderr.contains("ERROR") && stderr.contains("deleted while running"),
        "{stderr}"
    );
}
