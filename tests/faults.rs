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
            .args([protocol, &endpoint, &count.to_string(), "0.5"])
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
    server
        .metric(line_prefix)
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

    let http = export_under_fault("http/protobuf", format!("http://{}", server.http), 24);
    let grpc = export_under_fault("grpc", format!("http://{}", server.grpc), 24);
    // Both SDKs are exporting (python start-up is slow on a loaded machine) before the lock.
    wait_until!(Duration::from_secs(60), "both exporters to start", {
        metric(&server, "stallwatch_storage_spans_committed_total ") >= 4
    });
    let lock = hold_write_lock(&db, 8.0);
    let locked_at = Instant::now();

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
        assert_eq!(accepted.len(), 24, "{name}: {out}");
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
    // said once, not at every probe of the idle writer (one a second)
    std::thread::sleep(Duration::from_millis(3500));
    let stderr = server.stderr();
    assert_eq!(
        stderr.matches("storage gone: telemetry is refused").count(),
        1,
        "{stderr}"
    );
}

/// Regression (issue 11, "DNS rebinding on the OTLP/HTTP port"): `:4318` accepted a foreign
/// `Host` and stored the span. Now every listener applies the one Host rule: OTLP/HTTP and
/// the dashboard answer 421, OTLP/gRPC `PERMISSION_DENIED` for `:authority
/// attacker.example`; loopback names and `[dashboard] allowed_hosts` still pass.
#[test]
fn foreign_host_is_refused_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data"))
            .config("[dashboard]\nallowed_hosts = [\"box.lan\"]\n"),
    );
    let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"6b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let post = |host: &str| {
        http_client()
            .post(server.otlp_http("/v1/traces"))
            .header("host", host)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap()
    };
    let r = post("attacker.example:4318");
    assert_eq!(r.status().as_u16(), 421);
    let otlp: serde_json::Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert!(otlp["message"].as_str().unwrap().contains("DNS rebinding"));
    assert_eq!(
        otlp["message"],
        stallwatch_storage::hosts::refusal_message("attacker.example:4318")
    );
    let (_, t) = server.get_json("/api/v1/traces/6b8efff798038103d269b633813fc60c");
    assert!(
        t["spans"].as_array().is_none_or(|s| s.is_empty()),
        "stored: {t}"
    );
    assert_eq!(post("box.lan:4318").status().as_u16(), 200);
    assert_eq!(post("localhost").status().as_u16(), 200);

    let dash = http_client()
        .get(server.api("/api/v1/runners"))
        .header("host", "attacker.example")
        .send()
        .unwrap();
    assert_eq!(dash.status().as_u16(), 421);
    // One rule, one message on every listener (each in its own envelope).
    let dash: serde_json::Value = dash.json().unwrap();
    assert_eq!(
        dash["error"]["message"],
        stallwatch_storage::hosts::refusal_message("attacker.example")
    );

    // gRPC with a foreign :authority, through the real Python SDK's grpc channel option.
    let script = format!(
        "import grpc\nfrom opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as t, trace_service_pb2_grpc as g\n\
         ch = grpc.insecure_channel('{addr}', options=[('grpc.default_authority', 'attacker.example')])\n\
         try:\n    g.TraceServiceStub(ch).Export(t.ExportTraceServiceRequest(), timeout=10)\n    print('OK')\n\
         except grpc.RpcError as e:\n    print(e.code().name, e.details())\n",
        addr = server.grpc
    );
    let out = Command::new(python())
        .args(["-c", &script])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("PERMISSION_DENIED") && said.contains("attacker.example"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = script.replace("attacker.example", "localhost");
    let out = Command::new(python()).args(["-c", &ok]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");

    // Raw HTTP/1.1 on every listener, the gRPC port included (it answers HTTP/1.1 with a
    // hint naming the OTLP/HTTP port, but only to a loopback Host). Two Host lines are
    // refused even when the first is loopback (RFC 9112 §3.2): a proxy in front and
    // stallwatch could each read a different one.
    let raw = |addr: std::net::SocketAddr, hosts: &[&str]| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let lines: String = hosts.iter().map(|h| format!("Host: {h}\r\n")).collect();
        let req = format!(
            "POST /v1/traces HTTP/1.1\r\n{lines}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    for addr in [server.http, server.grpc, server.dashboard] {
        for hosts in [
            &["attacker.example"][..],
            &["127.0.0.1", "attacker.example"][..],
            &["127.0.0.1", "127.0.0.1"][..],
        ] {
            let out = raw(addr, hosts);
            assert!(out.starts_with("HTTP/1.1 421"), "{addr} {hosts:?}: {out}");
            assert!(out.contains("DNS rebinding"), "{addr} {hosts:?}: {out}");
            assert!(!out.contains(&server.http.to_string()), "{out}");
        }
    }
    // the healthy case: one loopback Host
    assert!(raw(server.http, &["127.0.0.1"]).starts_with("HTTP/1.1 200"));
    let hint = raw(server.grpc, &["127.0.0.1"]);
    assert!(hint.starts_with("HTTP/1.1 415"), "{hint}");
    assert!(hint.contains(&server.http.to_string()), "{hint}");
}

/// Issue 11, "Browser origins": `http://127.0.0.1:*` is allowed like `http://localhost:*`,
/// and a Private Network Access preflight from an allowed origin gets
/// `Access-Control-Allow-Private-Network: true` (a foreign origin gets 403, no PNA yes).
#[test]
fn cors_allows_127_0_0_1_and_answers_private_network_preflights() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let preflight = |origin: &str| {
        http_client()
            .request(reqwest::Method::OPTIONS, server.otlp_http("/v1/traces"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-private-network", "true")
            .send()
            .unwrap()
    };
    for origin in ["http://127.0.0.1:5173", "http://localhost:3000"] {
        let r = preflight(origin);
        assert_eq!(r.status().as_u16(), 204, "{origin}");
        assert_eq!(
            r.headers()["access-control-allow-private-network"],
            "true",
            "{origin}"
        );
    }
    let r = preflight("https://evil.example");
    assert_eq!(r.status().as_u16(), 403);
    assert!(r
        .headers()
        .get("access-control-allow-private-network")
        .is_none());
}

/// Regression (issue 11, "Inherited signal-specific OTLP variables blind the watchdog"):
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (and `_LOGS_`, `_PROTOCOL`, `_HEADERS` variants) set
/// around stallwatch reached its runners and overrode the injected endpoint. Now they are
/// removed; a runner's own `env` still wins; its own `OTEL_RESOURCE_ATTRIBUTES` is merged.
/// So are an inherited sampler, `OTEL_SDK_DISABLED` and `OTEL_TRACES_EXPORTER`, which kept
/// the spans from ever leaving the runner.
#[test]
fn runner_environment_drops_inherited_signal_specific_otlp_variables() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServerOpts::new(&dir.path().join("data"));
    for (k, v) in [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://elsewhere.example:4318/v1/traces",
        ),
        (
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "http://elsewhere.example:4318/v1/logs",
        ),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-api-key=secret"),
        // and what keeps spans from being exported at all (a new user's sampler set in
        // the shell turned the watchdog off for every spawned runner)
        ("OTEL_TRACES_SAMPLER", "always_off"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
        // and what strips a tool span's attributes or holds ended spans back
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "0"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "0"),
        ("OTEL_BSP_SCHEDULE_DELAY", "3600000"),
    ] {
        opts.env.push((k.into(), v.into()));
    }
    let server = Server::start_with(opts);
    let out = dir.path().join("env.json");
    let py = python();
    let script = format!(
        "import json,os,time\njson.dump(dict(os.environ), open({:?},'w'))\ntime.sleep(60)\n",
        out.display().to_string()
    );
    crate::chain::spawn_runner(
        &server,
        "envcheck",
        &[py.to_str().unwrap(), "-c", &script],
        None,
        &[
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "http://mine.example/v1/logs",
            ),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "team=lab,stallwatch.runner.id=spoof",
            ),
        ],
    );
    wait_until!(Duration::from_secs(20), "the runner's env dump", {
        std::fs::read_to_string(&out).is_ok_and(|t| t.ends_with('}'))
    });
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for gone in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        "OTEL_BSP_SCHEDULE_DELAY",
    ] {
        assert!(
            env.get(gone).is_none(),
            "{gone} was inherited: {}",
            env[gone]
        );
    }
    assert_eq!(
        env["OTEL_EXPORTER_OTLP_ENDPOINT"],
        format!("http://{}", server.http)
    );
    assert_eq!(
        env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"],
        "http://mine.example/v1/logs"
    );
    let attrs = env["OTEL_RESOURCE_ATTRIBUTES"].as_str().unwrap();
    assert!(
        attrs.starts_with("stallwatch.runner.id=envcheck,service.instance.id="),
        "{attrs}"
    );
    assert!(attrs.ends_with(",team=lab"), "{attrs}");
    assert!(server
        .stderr()
        .contains("overrides stallwatch's OTLP export setting"));
}

/// Issue 11 "Webhooks" and issue 17 point 15: deliveries are signed as Standard Webhooks
/// (the real `standardwebhooks` PyPI verifier accepts them), a receiver's `Retry-After` as
/// an HTTP-date is honoured with a fresh `webhook-timestamp` on the retry, and a receiver
/// that hangs never delays a healthy one (each has its own worker).
#[test]
fn webhooks_verify_with_standardwebhooks_and_a_hanging_receiver_delays_no_one() {
    let dir = tempfile::tempdir().unwrap();
    // base64("stallwatch-webhook-test-secret!!")
    let secret = "whsec_c3RhbGx3YXRjaC13ZWJob29rLXRlc3Qtc2VjcmV0ISE=";
    let port_file = dir.path().join("port");
    let mut receiver = Command::new(python())
        .arg(test_data("python/webhook_receiver.py"))
        .arg(&port_file)
        .args([secret, "first-429-date"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the webhook receiver");
    wait_until!(
        Duration::from_secs(20),
        "the receiver's port (is standardwebhooks installed? scripts/setup-test-env)",
        std::fs::read_to_string(&port_file).is_ok_and(|p| !p.is_empty())
    );
    let port = std::fs::read_to_string(&port_file).unwrap();
    // A receiver that accepts connections and never answers.
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging_addr = hanging.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hanging.incoming().flatten() {
            held.push(s);
        }
    });
    let config = format!(
        "[[alerts.webhook]]\nurl = \"http://{hanging_addr}/hook\"\nsecret = \"{secret}\"\nevents = [\"runner.started\"]\ntimeout_ms = 10000\n\n\
         [[alerts.webhook]]\nurl = \"http://127.0.0.1:{port}/hook\"\nsecret = \"{secret}\"\nevents = [\"runner.started\"]\nretry_initial_ms = 100\n"
    );
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config));
    let py = python();
    let registered = Instant::now();
    crate::chain::spawn_runner(
        &server,
        "hooked",
        &[py.to_str().unwrap(), "-c", "import time; time.sleep(60)"],
        None,
        &[],
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = receiver.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    let next = |what: &str| {
        let (at, line) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no {what} delivery; stderr:\n{}", server.stderr()));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v["ok"], true,
            "standardwebhooks refused the {what} delivery: {v}"
        );
        (at, v)
    };
    let (first_at, first) = next("first");
    assert_eq!(first["event"], "runner.started");
    assert!(
        first_at - registered < Duration::from_secs(5),
        "the healthy receiver waited {:?} behind the hanging one",
        first_at - registered
    );
    let (second_at, second) = next("retried");
    assert_eq!(
        second["id"], first["id"],
        "webhook-id must stay the same on a retry"
    );
    let gap = second_at - first_at;
    assert!(
        gap >= Duration::from_millis(1900),
        "Retry-After (HTTP-date, 2-3 s ahead) was not honoured: retried after {gap:?}"
    );
    assert!(
        second["ts"].as_str().unwrap().parse::<u64>().unwrap()
            > first["ts"].as_str().unwrap().parse::<u64>().unwrap(),
        "webhook-timestamp must be fresh on every attempt"
    );
    let _ = receiver.kill();
    let _ = receiver.wait();
}

/// Regression (issue 11, "Forwarding"): an upstream's `Retry-After` as an HTTP-date was
/// ignored (retried after 0.3 s). Now the forwarder waits until that date: the upstream
/// answers the first request 503 with a date 3 s ahead (whole seconds, so 2–3 s), and the
/// retry comes no earlier than ~2 s later.
#[test]
fn forwarder_honours_retry_after_as_http_date() {
    use std::io::{Read, Write};
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up_addr = upstream.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    std::thread::spawn(move || {
        let mut n = 0;
        for mut s in upstream.incoming().flatten() {
            // One request per connection is enough for this upstream: answer, then close.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            let body_len = loop {
                let k = match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break None,
                    Ok(k) => k,
                };
                buf.extend_from_slice(&chunk[..k]);
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    break Some((end + 4, len));
                }
            };
            let Some((start, len)) = body_len else {
                continue;
            };
            while buf.len() < start + len {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            let _ = tx.send(Instant::now());
            n += 1;
            let resp = if n == 1 {
                let at = std::time::SystemTime::now() + Duration::from_secs(3);
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    httpdate::fmt_http_date(at)
                )
            } else {
                "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            };
            let _ = s.write_all(resp.as_bytes());
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&format!(
        "[forward]\nendpoint = \"http://{up_addr}\"\nprotocol = \"http/protobuf\"\nretry_initial_ms = 100\nretry_max_ms = 10000\ntimeout_ms = 5000\npoll_interval_ms = 50\n"
    )));
    let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"7b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("no forwarded request");
    let second = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("no retry after the 503; stderr:\n{}", server.stderr()));
    let gap = second - first;
    assert!(
        gap >= Duration::from_millis(1900),
        "retried {gap:?} after a Retry-After HTTP-date 2-3 s ahead"
    );
}

/// Regression (issue 11, "HTTP/1.1 sent to the gRPC port"): an `http/protobuf` exporter
/// pointed at the gRPC port got a raw HTTP/2 SETTINGS frame. Now it gets a readable 415
/// naming the OTLP/HTTP address; real gRPC on the same port still works.
#[test]
fn http1_on_the_grpc_port_names_the_otlp_http_address() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let r = http_client()
        .post(format!("http://{}/v1/traces", server.grpc))
        .header("content-type", "application/x-protobuf")
        .body(Vec::new())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let text = r.text().unwrap();
    assert!(
        text.contains("OTLP/gRPC port")
            && text.contains(&format!("http://{}/v1/traces", server.http)),
        "{text}"
    );
    let script = format!(
        "import grpc\nfrom opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as t, trace_service_pb2_grpc as g\n\
         g.TraceServiceStub(grpc.insecure_channel('{}')).Export(t.ExportTraceServiceRequest(), timeout=10)\nprint('OK')\n",
        server.grpc
    );
    let out = Command::new(python())
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "OK",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `/metrics` text of `server`.
fn metrics_text(server: &Server) -> String {
    http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap()
}

/// Open file descriptors of process `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Issue 11, "Slow and idle clients": 1,000 sockets spread over the three listeners send
/// their request headers one byte per second. While they are all open, a real Python SDK
/// export and the dashboard answer promptly; the server closes every one of them within
/// the header read timeout (10 s) plus the close grace, and stallwatch's descriptors
/// come back down.
#[test]
fn a_thousand_slow_clients_are_closed_and_no_one_waits_for_them() {
    use std::io::{Read, Write};
    const SLOW: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let pid = server.child.id();
    wait_until!(
        Duration::from_secs(30),
        "readyz 200",
        server.get_json("/readyz").0 == 200
    );
    let fds_before = fd_count(pid);

    let targets = [server.http, server.dashboard, server.grpc];
    let opened = Instant::now();
    let mut socks: Vec<std::net::TcpStream> = (0..SLOW)
        .map(|i| {
            let s = std::net::TcpStream::connect(targets[i % 3]).expect("connect a slow client");
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    let request =
        b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
    // Drip: one byte per socket per second, on a thread, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dripper = {
        let stop = stop.clone();
        let mut writers: Vec<_> = socks.iter().map(|s| s.try_clone().unwrap()).collect();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < request.len() {
                for w in &mut writers {
                    let _ = w.write_all(&request[i..i + 1]);
                }
                i += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    // All 1,000 are open at the server.
    wait_until!(
        Duration::from_secs(10),
        "1,000 open connections in /metrics",
        {
            let m = metrics_text(&server);
            let open: u64 = m
                .lines()
                .filter(|l| l.starts_with("stallwatch_listener_connections{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            open >= SLOW as u64
        }
    );
    let fds_held = fd_count(pid);
    eprintln!("stallwatch descriptors: {fds_before} before, {fds_held} with the slow clients");
    assert!(
        fds_held + 20 >= fds_before + SLOW,
        "the slow sockets are not held: {fds_before} → {fds_held}"
    );

    // A normal export over OTLP/HTTP through the real SDK, and the dashboard, meanwhile.
    let t = Instant::now();
    let (st, _) = server.get_json("/readyz");
    let readyz_took = t.elapsed();
    assert_eq!(st, 200);
    let t = Instant::now();
    let sdk = export_under_fault("http/protobuf", format!("http://{}", server.http), 3)
        .join()
        .unwrap();
    let export_took = t.elapsed();
    assert_eq!(sdk["accepted"].as_array().unwrap().len(), 3, "{sdk}");
    let still_open = opened.elapsed();
    eprintln!("readyz {readyz_took:?}, SDK export of 3 spans {export_took:?} (python start included), with {SLOW} slow clients open for {still_open:?}");
    assert!(
        readyz_took < Duration::from_secs(2),
        "dashboard waited {readyz_took:?}"
    );
    assert!(
        still_open < Duration::from_secs(10),
        "the export finished only after the slow clients were closed ({still_open:?}); not a test of responsiveness"
    );
    for s in [&sdk["accepted"][0], &sdk["accepted"][2]] {
        assert!(stored(
            &server,
            s["trace_id"].as_str().unwrap(),
            s["span_id"].as_str().unwrap()
        ));
    }

    // Every slow socket is closed by the server: a read sees EOF (or a reset).
    let limit = Duration::from_secs(10) + Duration::from_secs(10) + Duration::from_secs(8);
    let mut latest = Duration::ZERO;
    for s in &mut socks {
        let left = limit
            .saturating_sub(opened.elapsed())
            .max(Duration::from_millis(10));
        s.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 512];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue, // an error answer before the close is fine
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    panic!(
                        "a slow client was still open {:?} after connecting",
                        opened.elapsed()
                    )
                }
                Err(_) => break, // reset
            }
        }
        latest = latest.max(opened.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    dripper.join().unwrap();
    eprintln!("all {SLOW} slow clients closed by the server within {latest:?} of connecting");
    drop(socks);
    wait_until!(
        Duration::from_secs(10),
        "stallwatch's descriptors to come back",
        fd_count(pid) <= fds_before + 10
    );
    let m = metrics_text(&server);
    let timed_out: u64 = m
        .lines()
        .filter(|l| {
            l.starts_with("stallwatch_listener_connections_closed_total{")
                && l.contains("reason=\"header_timeout\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        timed_out >= SLOW as u64,
        "header timeouts counted: {timed_out}\n{m}"
    );
}

/// Framing hyper lets through is refused on both HTTP listeners, each in its envelope: a
/// transfer coding other than chunked (501: its body would be read still compressed), and
/// two Content-Type fields (400: which one is meant cannot be known); a body declared too
/// large is refused unread with `Connection: close`. Chunked framing and a content type
/// with parameters are served (the healthy case).
#[test]
fn framing_faults_are_refused_on_every_http_listener() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let body = r#"{"resourceSpans":[]}"#;
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for (addr, path) in [
        (server.http, "/v1/traces"),
        (server.dashboard, "/api/v1/import/traces"),
    ] {
        let token = server.token();
        let send = |headers: &str, payload: &str| {
            let req = format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{headers}\r\n{payload}"
            );
            half_closed_exchange(addr, req.as_bytes())
        };
        let said = send(
            "Content-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n",
            &chunked,
        );
        assert!(said.starts_with("HTTP/1.1 501"), "{path}: {said:?}");
        assert!(said.contains("gzip"), "{path}: {said:?}");
        let said = send(
            &format!(
                "Content-Type: application/json\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n",
                body.len()
            ),
            body,
        );
        assert!(said.starts_with("HTTP/1.1 400"), "{path}: {said:?}");
        assert!(said.contains("Content-Type"), "{path}: {said:?}");
        // healthy: chunked framing, and a parameter on the one type
        let said = send(
            "Content-Type: application/json; charset=utf-8\r\nTransfer-Encoding: chunked\r\n",
            &chunked,
        );
        assert!(said.starts_with("HTTP/1.1 200"), "{path}: {said:?}");
        // A body declared too large is refused unread, and the connection is said closed.
        let said = send(
            "Content-Type: application/json\r\nContent-Length: 999999999\r\n",
            "",
        );
        assert!(said.starts_with("HTTP/1.1 413"), "{path}: {said:?}");
        assert!(
            said.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{path}: {said:?}"
        );
    }
}

/// Strings cut inside a character by JavaScript (a lone UTF-16 surrogate, which
/// `JSON.stringify` writes as an escape), sent by the Node SDK's own OTLP/JSON serializers:
/// the span and the log record are stored with U+FFFD in place of the half character, and
/// the answer says so (`partialSuccess`, nothing rejected). Before, serde_json refused the
/// whole export with a 400 that named no field, and the batch was lost.
#[test]
fn strings_cut_inside_a_character_by_javascript_are_stored_with_a_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let stdout = run_node_script(&server, "export_json_cut_strings.js", &[]);
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    for a in &answers {
        // the SDK really sent the escape
        assert!(a["sent"].as_str().unwrap().contains("\\ud83d"), "{a}");
        assert_eq!(a["status"], 200, "{a}");
        let body: serde_json::Value = serde_json::from_str(a["body"].as_str().unwrap()).unwrap();
        let msg = body["partialSuccess"]["errorMessage"]
            .as_str()
            .unwrap_or("");
        assert!(msg.contains("replaced by U+FFFD"), "{a}");
    }
    let (_, list) = server.get_json("/api/v1/traces?service=node-cut-strings");
    let trace_id = list["items"][0]["trace_id"].as_str().unwrap().to_string();
    let (_, t) = server.get_json(&format!("/api/v1/traces/{trace_id}"));
    let attrs = &t["spans"][0]["attributes"];
    let value = |k: &str| {
        attrs
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv["key"] == k)
            .map(|kv| kv["value"].clone())
            .unwrap_or_else(|| panic!("no {k} in {attrs}"))
    };
    assert_eq!(
        value("user.input"),
        serde_json::json!({"stringValue": "hi \u{FFFD}"})
    );
    assert_eq!(
        value("user.tail"),
        serde_json::json!({"stringValue": "\u{FFFD}x"})
    );
    assert_eq!(
        value("user.whole"),
        serde_json::json!({"stringValue": "hi \u{1F600}"})
    );
    let (_, logs) = server.get_json("/api/v1/logs?service=node-cut-strings");
    assert_eq!(
        logs["items"][0]["body"],
        serde_json::json!({"stringValue": "hi \u{FFFD}"}),
        "{logs}"
    );
}

/// Sends `request` on a new connection to `addr`, shuts down the sending side at once (as
/// `nc -N` and HTTP/1.0 scripts do), and answers everything the server wrote back.
fn half_closed_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

/// A client that shuts down its sending side after a whole request is answered on every
/// listener, and an export sent so is stored: before, hyper took the end of input for an
/// abort, and some of such requests (those that waited on storage) were dropped
/// unanswered and unstored. HTTP/1.0 without `Host` is served (the protocol does not
/// require it); HTTP/1.1 without it is still refused.
#[test]
fn half_closed_requests_are_answered_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    for i in 0..20u32 {
        let trace = format!("{:032x}", 0xa1f0_0000u64 + u64::from(i));
        let body = format!(
            r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"{trace}","spanId":"00000000000000a1","name":"half-{i}","startTimeUnixNano":"1","endTimeUnixNano":"2"}}]}}]}}]}}"#
        );
        // HTTP/1.0 without Host on odd rounds.
        let (version, host) = if i % 2 == 1 {
            ("1.0", String::new())
        } else {
            ("1.1", "Host: 127.0.0.1\r\n".to_string())
        };
        let req = format!(
            "POST /v1/traces HTTP/{version}\r\n{host}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let said = half_closed_exchange(server.http, req.as_bytes());
        assert!(
            said.starts_with(&format!("HTTP/{version} 200")),
            "export {i}: {said:?}"
        );
        let (_, t) = server.get_json(&format!("/api/v1/traces/{trace}"));
        assert_eq!(
            t["spans"].as_array().map(Vec::len),
            Some(1),
            "export {i} not stored: {t}"
        );
        // The dashboard: a read that waits on storage, then one that does not.
        for path in ["/api/v1/traces?limit=5", "/healthz"] {
            let req = format!("GET {path} HTTP/{version}\r\n{host}\r\n");
            let said = half_closed_exchange(server.dashboard, req.as_bytes());
            assert!(
                said.contains(" 200 "),
                "dashboard {path} round {i}: {said:?}"
            );
        }
        // The gRPC port answers HTTP/1.x with its hint.
        let req = b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n";
        let said = half_closed_exchange(server.grpc, req);
        assert!(
            said.starts_with("HTTP/1.1 415"),
            "gRPC port round {i}: {said:?}"
        );
    }
    // HTTP/1.1 must name its host (RFC 9112 §3.2).
    let said = half_closed_exchange(server.dashboard, b"GET /healthz HTTP/1.1\r\n\r\n");
    assert!(said.starts_with("HTTP/1.1 421"), "{said:?}");
}

/// Issue 11, "Slow and idle clients": the per-listener connection cap closes a connection
/// over it at once (counted), the idle timeout closes a kept-alive connection, and once
/// the holders are gone the listener serves again (the healthy case).
#[test]
fn the_connection_cap_and_the_idle_timeout_hold_per_listener() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(
        "[otlp]\nmax_connections = 20\nidle_timeout_ms = 1500\nheader_read_timeout_ms = 30000\n",
    ));
    let holders: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(server.http).unwrap())
        .collect();
    wait_until!(Duration::from_secs(5), "20 open OTLP/HTTP connections", {
        metrics_text(&server).contains("stallwatch_listener_connections{listener=\"otlp_http\"} 20")
    });
    let mut over = std::net::TcpStream::connect(server.http).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let n = over.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the connection over the cap was answered");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "closed only after {:?}",
        t.elapsed()
    );
    assert!(
        metrics_text(&server)
            .contains("stallwatch_listener_connections_refused_total{listener=\"otlp_http\"} 1"),
        "{}",
        metrics_text(&server)
    );
    // The dashboard has its own cap: it is not affected.
    assert_eq!(server.get_json("/readyz").0, 200);
    drop(holders);

    // Healthy: a keep-alive client is served, then closed after 1.5 s without a request.
    let mut c = None;
    wait_until!(Duration::from_secs(5), "the listener to serve again", {
        let mut s = std::net::TcpStream::connect(server.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let body = r#"{"resourceSpans":[]}"#;
        let req = format!(
            "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut got = [0u8; 12];
        let ok = s.read_exact(&mut got).is_ok() && &got == b"HTTP/1.1 200";
        if ok {
            c = Some(s);
        }
        ok
    });
    let mut c = c.unwrap();
    let served = Instant::now();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    let idle = served.elapsed();
    assert!(
        idle >= Duration::from_millis(1000) && idle < Duration::from_secs(6),
        "idle keep-alive connection closed after {idle:?}, want about 1.5 s"
    );
    assert!(metrics_text(&server).contains(
        "stallwatch_listener_connections_closed_total{listener=\"otlp_http\",reason=\"idle\"} 1"
    ));
}

/// A client that sent a head and part of a body holds no connection for long, on a
/// listener whose handler would wait for ever (the dashboard's control API): with
/// `body_read_timeout_ms = 1000` it is dropped (counted as `body_timeout`), while a client
/// that sends its body slowly, a byte every 300 ms, is served (the healthy case). The
/// minimum body rate's grace is set past the test (60 s) so that only the gap rule is
/// tested here; the rate rule has its own test below.
#[test]
fn a_stalled_request_body_is_dropped_on_the_dashboard_and_a_slow_one_is_served() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data"))
            .config("[dashboard]\nbody_read_timeout_ms = 1000\nbody_rate_grace_ms = 60000\n"),
    );
    let token = server.token();
    let head = |len: usize| {
        format!(
            "POST /api/v1/runners HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // refused as a registration (an unknown key): only the answer matters here
    let body = br#"{"id": "slow", "no_such_key": true}"#;
    // stalled: the head and 1 byte of the body, then nothing
    let mut stalled = std::net::TcpStream::connect(server.dashboard).unwrap();
    stalled.write_all(head(body.len()).as_bytes()).unwrap();
    stalled.write_all(&body[..1]).unwrap();
    let t0 = Instant::now();
    // slow but alive: the same request, a byte every 300 ms (~11 s in all)
    let mut slow = std::net::TcpStream::connect(server.dashboard).unwrap();
    slow.write_all(head(body.len()).as_bytes()).unwrap();
    let dripper = std::thread::spawn(move || {
        for b in body.iter() {
            slow.write_all(&[*b]).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = [0u8; 10];
        slow.read_exact(&mut got).unwrap();
        got
    });
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = match stalled.read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
        Err(e) => panic!("the stalled body was not dropped within 10 s: {e}"),
    };
    let dropped_after = t0.elapsed();
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
    assert!(
        dropped_after >= Duration::from_millis(900) && dropped_after < Duration::from_secs(5),
        "dropped after {dropped_after:?}, want about 1 s"
    );
    // the slow one got its answer: the registration refused by name
    assert_eq!(&dripper.join().unwrap(), b"HTTP/1.1 4");
    assert!(
        metrics_text(&server).contains(
            "stallwatch_listener_connections_closed_total{listener=\"dashboard\",reason=\"body_timeout\"} 1"
        ),
        "{}",
        metrics_text(&server)
    );
}

/// An OTLP/JSON trace export of `spans` spans (traces of their own for each `tag`), each
/// with a `pad`-character attribute.
fn json_export(spans: usize, pad: usize, tag: u8) -> Vec<u8> {
    let spans: Vec<serde_json::Value> = (0..spans)
        .map(|i| {
            serde_json::json!({
                "traceId": format!("{:02x}{:030x}", tag, i / 16 + 1),
                "spanId": format!("{:016x}", i + 1),
                "name": format!("slow link {i}"),
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000000000500000",
                "attributes": [{"key": "pad", "value": {"stringValue": "p".repeat(pad)}}],
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "resourceSpans": [{"scopeSpans": [{"spans": spans}]}]
    }))
    .unwrap()
}

/// One raw HTTP/1.1 request on a thread: `head` (without its blank line; `Content-Length`
/// is added), then `body` `piece` bytes every `every`, never closing its side (the thread
/// keeps writing, ignoring errors, until the answer is read). Answers the whole answer and
/// how long after connecting it was complete.
fn paced_request(
    addr: std::net::SocketAddr,
    head: String,
    body: Vec<u8>,
    piece: usize,
    every: Duration,
) -> std::thread::JoinHandle<(String, Duration)> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(
            format!(
                "{head}Connection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut w = s.try_clone().unwrap();
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                for p in body.chunks(piece) {
                    if done.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let _ = w.write_all(p);
                    std::thread::sleep(every);
                }
                w
            })
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let took = t0.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(writer.join());
        (String::from_utf8_lossy(&answer).into_owned(), took)
    })
}

/// The outside tester's report, scaled down: 30 OTLP/HTTP clients each declare a
/// 100,000-byte trace export and send its body a byte every 200 ms. The budget (2 MiB
/// here) is reserved from the declared length, so ten of them hold it all and the other
/// twenty are answered 503 at once, and a real 54 kB export gets 503 too: the gap timeouts
/// never fire on a trickle. With `body_min_bytes_per_s = 32768` and
/// `body_rate_grace_ms = 1000`, the ten are cut soon after the grace (400 naming the
/// rule, counted), the budget comes back and the real export is stored while their
/// clients are still sending; a 159 kB export sent at twice the minimum rate (~2.4 s) is
/// stored too. On the dashboard, a trickled control request and a trickled `/mcp` message
/// are answered 408 `body_too_slow`, while a small control request sent slowly within the
/// grace is served.
#[test]
fn trickled_bodies_are_cut_on_every_listener_and_real_exports_get_through() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(
        "[otlp]\nmax_request_bytes = 1048576\nmax_inflight_bytes = 2097152\n\
         body_min_bytes_per_s = 32768\nbody_rate_grace_ms = 1000\n\
         [dashboard]\nbody_min_bytes_per_s = 32768\nbody_rate_grace_ms = 1000\n",
    ));
    let ms = Duration::from_millis;
    let otlp_head =
        |ct: &str| format!("POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\n");
    let t0 = Instant::now();
    let tricklers: Vec<_> = (0..30)
        .map(|_| {
            paced_request(
                server.http,
                otlp_head("application/json"),
                vec![b' '; 100_000],
                1,
                ms(200),
            )
        })
        .collect();
    // ten hold 200,000 bytes each (the body and its decode share)
    wait_until!(
        Duration::from_secs(10),
        "the tricklers to hold the budget",
        metric(&server, "stallwatch_otlp_inflight_bytes ") >= 2_000_000
    );
    let real = json_export(100, 300, 1);
    assert!(real.len() > 50_000 && real.len() < 60_000, "{}", real.len());
    let post = |body: &[u8]| {
        http_client()
            .post(server.otlp_http("/v1/traces"))
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .unwrap()
    };
    let r = post(&real);
    assert_eq!(r.status(), 503, "the tricklers did not hold the budget");
    assert!(
        t0.elapsed() < ms(1000),
        "too late to see the budget held before the grace ({:?})",
        t0.elapsed()
    );

    // the dashboard: a trickled control request, and a small one sent slowly in the grace
    let token = server.token();
    let control_head = format!(
        "POST /api/v1/runners HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\n"
    );
    let body = br#"{"id": "slow", "no_such_key": true}"#.to_vec();
    let dash_trickle = paced_request(
        server.dashboard,
        control_head.clone(),
        [body.clone(), vec![b' '; 200]].concat(),
        1,
        ms(200),
    );
    let dash_slow = paced_request(server.dashboard, control_head, body, 1, ms(20));
    let mcp_trickle = paced_request(
        server.dashboard,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n"
            .to_string(),
        [
            &br#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}"#[..],
            &[b' '; 200],
        ]
        .concat(),
        1,
        ms(200),
    );

    let (mut cut, mut busy) = (0, 0);
    for t in tricklers {
        let (text, took) = t.join().unwrap();
        if text.starts_with("HTTP/1.1 503") {
            busy += 1;
            continue;
        }
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("too slowly"), "{text}");
        assert!(text.contains("body_min_bytes_per_s"), "{text}");
        assert!(
            took < Duration::from_secs(6),
            "a trickle was cut only after {took:?}"
        );
        cut += 1;
    }
    assert_eq!((cut, busy), (10, 20));
    wait_until!(
        Duration::from_secs(5),
        "the budget to be released",
        metric(&server, "stallwatch_otlp_inflight_bytes ") == 0
    );
    assert_eq!(post(&real).status(), 200);
    assert!(stored(
        &server,
        &format!("{:02x}{:030x}", 1, 1),
        &format!("{:016x}", 1)
    ));

    // the healthy case: 159 kB at twice the minimum rate (4 KiB every 62 ms), ~2.4 s
    let slow = json_export(250, 400, 2);
    let (text, took) = paced_request(
        server.http,
        otlp_head("application/json"),
        slow,
        4096,
        ms(62),
    )
    .join()
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(took > ms(1500), "not slow: {took:?}");
    assert!(stored(
        &server,
        &format!("{:02x}{:030x}", 2, 16),
        &format!("{:016x}", 250)
    ));

    let (text, took) = dash_trickle.join().unwrap();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_too_slow"), "{text}");
    assert!(took < Duration::from_secs(6), "cut only after {took:?}");
    let (text, took) = mcp_trickle.join().unwrap();
    assert!(text.starts_with("HTTP/1.1 408"), "/mcp: {text}");
    assert!(text.contains("body_too_slow"), "{text}");
    assert!(took < Duration::from_secs(6), "cut only after {took:?}");
    let (text, _) = dash_slow.join().unwrap();
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("no_such_key"), "{text}");

    assert_eq!(
        metric(
            &server,
            "stallwatch_otlp_requests_refused_total{reason=\"body_too_slow\"}"
        ),
        10
    );
    assert_eq!(
        metric(
            &server,
            "stallwatch_listener_request_bodies_too_slow_total{listener=\"otlp_http\"}"
        ),
        10
    );
    assert_eq!(
        metric(
            &server,
            "stallwatch_listener_request_bodies_too_slow_total{listener=\"dashboard\"}"
        ),
        2
    );
}

/// A test CA and a server certificate for `localhost` / 127.0.0.1 signed by it, written as
/// PEM files into `dir`: (ca.pem, server.pem, server.key).
fn test_ca(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "stallwatch test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let leaf_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, leaf_key.serialize_pem()).unwrap();
    paths
}

/// A running `tests/python/tls_otlp_receiver.py`; its export lines arrive on `lines`.
struct TlsReceiver {
    child: std::process::Child,
    port: u16,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl TlsReceiver {
    fn start(mode: &str, cert: &std::path::Path, key: &std::path::Path) -> TlsReceiver {
        let mut child = Command::new(python())
            .arg(test_data("python/tls_otlp_receiver.py"))
            .arg(mode)
            .arg(cert)
            .arg(key)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the python TLS receiver");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let port = first
            .trim()
            .strip_prefix("port ")
            .unwrap_or_else(|| {
                panic!("TLS receiver ({mode}) did not start (is grpcio in the venv?): {first:?}")
            })
            .parse()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        TlsReceiver { child, port, lines }
    }
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn post_one_span(server: &Server, span_id: &str) {
    let body = format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"7b8efff798038103d269b633813fc60d","spanId":"{span_id}","name":"tls","startTimeUnixNano":"1","endTimeUnixNano":"2"}}]}}]}}]}}"#
    );
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// Issue 11, "Forwarding": an `https://` upstream over rustls, trusting a test CA from
/// `[forward] ca_file` (HTTP/protobuf), and the same from the standard
/// `OTEL_EXPORTER_OTLP_*` variables alone (gRPC, headers percent-decoded); without the CA
/// the upstream's certificate is refused and nothing is delivered.
#[test]
fn forwarder_speaks_tls_with_a_configured_ca_and_reads_the_standard_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = test_ca(dir.path());

    // HTTP/protobuf, CA from the section.
    let http_up = TlsReceiver::start("http", &cert, &key);
    let a = Server::start_with(ServerOpts::new(&dir.path().join("a")).config(&format!(
        "[forward]\nendpoint = \"https://localhost:{}\"\nprotocol = \"http/protobuf\"\nca_file = {:?}\npoll_interval_ms = 50\nretry_initial_ms = 100\n[forward.headers]\nx-test = \"section\"\n",
        http_up.port,
        ca.display().to_string()
    )));
    post_one_span(&a, "eee19b7ec3c1b101");
    let got = http_up
        .lines
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("nothing reached the TLS upstream; stderr:\n{}", a.stderr()));
    assert_eq!(got["spans"], 1, "{got}");
    assert_eq!(got["x-test"], "section", "{got}");
    drop(a);

    // gRPC, everything from the standard variables (the section only turns forwarding on).
    let grpc_up = TlsReceiver::start("grpc", &cert, &key);
    let mut opts = ServerOpts::new(&dir.path().join("b"))
        .config("[forward]\npoll_interval_ms = 50\nretry_initial_ms = 100\n");
    opts.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            format!("https://localhost:{}", grpc_up.port),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into()),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE".into(),
            ca.display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS".into(),
            "x-test=from%20env".into(),
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT".into(), "5000".into()),
    ];
    let b = Server::start_with(opts);
    post_one_span(&b, "eee19b7ec3c1b102");
    let got = grpc_up
        .lines
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "nothing reached the TLS gRPC upstream; stderr:\n{}",
                b.stderr()
            )
        });
    assert_eq!(got["spans"], 1, "{got}");
    assert_eq!(got["x-test"], "from env", "{got}");
    drop(b);

    // No CA: the test CA is not among the web PKI roots, so nothing is accepted upstream.
    let c = Server::start_with(ServerOpts::new(&dir.path().join("c")).config(&format!(
        "[forward]\nendpoint = \"https://localhost:{}\"\nprotocol = \"http/protobuf\"\npoll_interval_ms = 50\nretry_initial_ms = 100\n",
        http_up.port
    )));
    post_one_span(&c, "eee19b7ec3c1b103");
    assert!(
        http_up.lines.recv_timeout(Duration::from_secs(4)).is_err(),
        "an upstream with an unknown CA was trusted"
    );
}

/// Issue 11 new-user finding: a span whose end is before its start is refused one by one
/// on both transports (`partial_success.rejected_spans`, a message naming the span,
/// counted as `end_before_start`), while a zero-length span next to it is stored.
#[test]
fn a_span_ending_before_it_starts_is_refused_on_both_transports() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let span = |sid: u8, name: &str, start: u64, end: u64| Span {
        trace_id: vec![0x5a; 16],
        span_id: vec![sid; 8],
        name: name.into(),
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        ..Default::default()
    };
    let req = |a: u8, b: u8| ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![
                    span(a, "backwards", 2_000_000_000, 1_000_000_000),
                    span(b, "instant", 1_000_000_000, 1_000_000_000),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    // OTLP/HTTP (protobuf).
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(req(0x11, 0x12).encode_to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let resp = ExportTraceServiceResponse::decode(r.bytes().unwrap()).unwrap();
    let p = resp.partial_success.expect("partial_success");
    assert_eq!(p.rejected_spans, 1, "{p:?}");
    assert!(
        p.error_message.contains("\"backwards\"")
            && p.error_message.contains("1111111111111111")
            && p.error_message.contains("ends before it starts"),
        "{p:?}"
    );
    // OTLP/gRPC.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let p = rt.block_on(async {
        let mut c = TraceServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        c.export(req(0x21, 0x22))
            .await
            .unwrap()
            .into_inner()
            .partial_success
            .unwrap()
    });
    assert_eq!(p.rejected_spans, 1, "{p:?}");
    assert!(p.error_message.contains("2121212121212121"), "{p:?}");
    let trace = "5a".repeat(16);
    assert!(stored(&server, &trace, &"12".repeat(8)));
    assert!(stored(&server, &trace, &"22".repeat(8)));
    assert!(!stored(&server, &trace, &"11".repeat(8)));
    assert!(!stored(&server, &trace, &"21".repeat(8)));
    assert!(metrics_text(&server)
        .contains("stallwatch_otlp_records_refused_total{reason=\"end_before_start\"} 2"));
}

/// Every `{"step": .., "at_ms": ..}` object inside `v`, in document order.
fn steps_in(v: &serde_json::Value, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::Object(m) => {
            if let (Some(s), Some(at)) = (
                m.get("step").and_then(|s| s.as_str()),
                m.get("at_ms").and_then(|a| a.as_u64()),
            ) {
                out.push((s.to_string(), at));
            }
            m.values().for_each(|x| steps_in(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| steps_in(x, out)),
        _ => {}
    }
}

/// Issue 11, "act without waiting on the database" and "Trips are silent in the log": a
/// runner deadlocks inside a tool span, then another process holds `BEGIN IMMEDIATE` on
/// the database. The trip and the termination still happen on time (within the SLA plus
/// the heartbeat bound plus the grace, while the lock is held), the incidents appear once
/// the lock ends, and the trip is exactly one WARN line naming the runner, the verdict and
/// the reason.
#[test]
fn a_runner_stalled_while_the_database_is_locked_is_stopped_on_time_and_logged() {
    use crate::chain::{chain_config, python_runner};
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    let reg = python_runner(&server, "py-locked", "deadlock", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    // The tool span's start is committed (the runner's worst open span) before the lock.
    wait_until!(Duration::from_secs(30), "the runner's open tool span", {
        server.get_json("/api/v1/runners/py-locked").1["worst_span"].is_object()
    });
    const LOCK_S: f64 = 14.0;
    let lock = hold_write_lock(&server.data_dir.join("stallwatch.db"), LOCK_S);
    let locked_at = Instant::now();
    // SLA 2 s + heartbeat bound 3 s + grace 1 s, plus slack for a loaded machine.
    let bound = Duration::from_millis(crate::chain::SLA_MS + 3000 + 1000 + 4000);
    while process_alive(pid) {
        assert!(
            locked_at.elapsed() < bound,
            "the stalled runner still runs {:?} into the lock; stderr:\n{}",
            locked_at.elapsed(),
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped_after = locked_at.elapsed();
    assert!(
        stopped_after < Duration::from_secs_f64(LOCK_S - 1.0),
        "stopped only after the lock ended ({stopped_after:?})"
    );
    eprintln!("stalled runner stopped {stopped_after:?} into the database lock");
    // Held, not lost: nothing is in the file yet, everything is once the lock ends.
    assert!(
        !incidents(&server, "py-locked")
            .iter()
            .any(|i| i["event"] == "breaker.opened"),
        "the incident was written through the lock?"
    );
    let mut lock = lock;
    lock.wait().unwrap();
    let opened = wait_incident(
        &server,
        "py-locked",
        "breaker.opened",
        Duration::from_secs(30),
    );
    wait_incident(
        &server,
        "py-locked",
        "runner.terminated",
        Duration::from_secs(30),
    );
    let reason = opened["reason"].as_str().unwrap().to_string();

    // One WARN line for the trip, naming runner, verdict (event) and reason.
    let stderr = server.stderr();
    let trip_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("stallwatch::incident")
                && l.contains("breaker.opened")
                && l.contains("py-locked")
        })
        .collect();
    assert_eq!(
        trip_lines.len(),
        1,
        "trip log lines: {trip_lines:#?}\n{stderr}"
    );
    let line = trip_lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("event=breaker.opened") && line.contains("reason="),
        "{line}"
    );
    let first_words: String = reason
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        line.contains(&first_words),
        "the line does not carry the reason {reason:?}: {line}"
    );
}

/// Issue 11, "A stopped (SIGSTOP) runner waits out the whole grace period": stallwatch
/// sends SIGCONT right after SIGTERM, so a SIGSTOPped runner (its heartbeat lost) ends by
/// the SIGTERM within 100 ms, measured on the termination's own step clock.
#[test]
fn a_sigstopped_runner_ends_by_sigterm_within_100_ms() {
    use crate::chain::{chain_config, python_runner};
    let dir = tempfile::tempdir().unwrap();
    // A grace far longer than 100 ms, so SIGKILL cannot be what ends it.
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data"))
            .config(&chain_config("").replace("grace_ms = 1000", "grace_ms = 5000")),
    );
    let reg = python_runner(&server, "py-stopped", "healthy", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    wait_until!(Duration::from_secs(30), "the runner to be running", {
        server.get_json("/api/v1/runners/py-stopped").1["lifecycle"] == "running"
    });
    std::thread::sleep(Duration::from_millis(500));
    let st = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let terminated = wait_incident(
        &server,
        "py-stopped",
        "runner.terminated",
        Duration::from_secs(40),
    );
    wait_until!(
        Duration::from_secs(10),
        "the runner process to be gone",
        !process_alive(pid)
    );
    let mut steps = Vec::new();
    steps_in(&terminated["evidence"], &mut steps);
    let at = |name: &str| {
        steps
            .iter()
            .find(|(s, _)| s == name)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("no {name} step in {terminated:#}"))
    };
    let term = at("sigterm_sent");
    let exited = at("exited");
    assert!(
        !steps.iter().any(|(s, _)| s == "sigkill_sent"),
        "SIGKILL was needed: {terminated:#}"
    );
    eprintln!(
        "SIGSTOPped runner exited {} ms after SIGTERM",
        exited - term
    );
    assert!(
        exited >= term && exited - term < 100,
        "exited {} ms after SIGTERM: {terminated:#}",
        exited.saturating_sub(term)
    );
}

/// Histograms at the ends of their types (a count of u64::MAX, an exponential offset of
/// i32::MAX), charted: the points query answers and every read after it still works. Before,
/// the quantile overflowed (debug builds panicked), and the panic left the read connection
/// inside its transaction: every later read answered 500 until a restart.
#[test]
fn extreme_histograms_chart_and_no_read_fails_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let t = "1700000000000000000";
    let body = serde_json::json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "h5", "histogram": {"aggregationTemporality": 2, "dataPoints": [
            {"timeUnixNano": t, "count": "18446744073709551615",
             "bucketCounts": ["18446744073709551614", "1"], "explicitBounds": [1.0]}]}},
        {"name": "e5", "exponentialHistogram": {"aggregationTemporality": 2, "dataPoints": [
            {"timeUnixNano": t, "count": "3", "scale": 0,
             "positive": {"offset": 2147483647, "bucketCounts": ["1", "1", "1"]}}]}}
    ]}]}]});
    let r = http_client()
        .post(server.otlp_http("/v1/metrics"))
        .json(&body)
        .send()
        .unwrap();
    let status = r.status();
    let answer = r.text().unwrap();
    assert_eq!(status, 200, "{answer}");
    // both stored: their counts are their buckets' sums, as OTLP requires
    assert!(!answer.contains("rejected"), "{answer}");
    for _ in 0..3 {
        for name in ["h5", "e5"] {
            let (status, v) = server.get_json(&format!(
                "/api/v1/metrics/{name}/points?from=1699999999000000000&to=1700000001000000000&step=1s"
            ));
            assert_eq!(status, 200, "{name}: {v}");
        }
        let (status, v) = server.get_json("/api/v1/traces?limit=1");
        assert_eq!(status, 200, "{v}");
        let (status, v) = server.get_json("/api/v1/logs?limit=1");
        assert_eq!(status, 200, "{v}");
    }
}

/// A stage that dies of a panic (a bug) must not leave stallwatch running without it: a
/// watchdog task that panicked tripped nothing while exports still got 200. Now stallwatch
/// records `sidecar.degraded`, shuts down in order and exits with code 1, so its supervisor
/// starts it again; the export acknowledged before is stored.
#[test]
fn a_stage_that_panics_stops_stallwatch_with_an_incident_and_exit_code_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut opts = ServerOpts::new(&data);
    opts.env.push((
        "STALLWATCH_FAILPOINTS".into(),
        "watchdog.observe:1:panic".into(),
    ));
    let mut server = Server::start_with(opts);
    let trace = "5b8efff798038103d269b633813fc60d";
    let body = format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"{trace}","spanId":"eee19b7ec3c1b175","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}}]}}]}}]}}"#
    );
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "stallwatch kept running without its watchdog:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = server.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("failpoint watchdog.observe:1 reached")
            && stderr.contains("the watchdog stopped while running"),
        "{stderr}"
    );

    let again = Server::start(&data);
    assert!(stored(&again, trace, "eee19b7ec3c1b175"));
    let (st, all) = again.get_json("/api/v1/incidents?limit=200");
    assert_eq!(st, 200);
    let degraded = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["event"] == "sidecar.degraded")
        .unwrap_or_else(|| panic!("no sidecar.degraded incident: {all:#}"));
    assert_eq!(degraded["evidence"]["stage"], "watchdog", "{degraded:#}");
}
