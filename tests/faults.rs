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
