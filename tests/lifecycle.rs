//! Living inside a desktop app: `--exit-with-parent`, `POST /api/v1/shutdown`, the optional
//! ingest token. Real processes and the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use prost::Message;

use crate::chain::process_alive;
use crate::spine::{post_protobuf, rich_request};
use crate::support::*;

const SLEEPER: &str = "[[runner]]\nid = \"sleeper\"\nspawn = { argv = [\"sleep\", \"300\"] }\n";

fn runner_pid(server_api: &str, id: &str) -> u64 {
    let mut pid;
    wait_until!(Duration::from_secs(20), "the runner's pid", {
        let r = http_client()
            .get(format!("{server_api}/api/v1/runners/{id}"))
            .send()
            .unwrap();
        let v: serde_json::Value = r.json().unwrap_or_default();
        pid = v["pid"].as_u64();
        pid.is_some()
    });
    pid.unwrap()
}

#[test]
fn exit_with_parent_stops_spawned_runners_when_the_parent_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, SLEEPER).unwrap();
    // A parent shell that starts stallwatch and waits; the test SIGKILLs the shell, as a
    // desktop app killed by the OS would die.
    let mut parent = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" serve --exit-with-parent --config \"$1\" --data-dir \"$2\" --otlp-grpc-listen 127.0.0.1:0 --otlp-http-listen 127.0.0.1:0 --dashboard-listen 127.0.0.1:0 & wait")
        .arg(bin())
        .arg(&cfg)
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let api = format!("http://{}", ready["dashboard"].as_str().unwrap());
    let sw_pid: u64 = std::fs::read_to_string(data.join("lock"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let runner = runner_pid(&api, "sleeper");
    assert!(process_alive(sw_pid) && process_alive(runner));

    parent.kill().unwrap();
    parent.wait().unwrap();
    wait_until!(
        Duration::from_secs(30),
        "stallwatch to exit after its parent died",
        !process_alive(sw_pid)
    );
    wait_until!(
        Duration::from_secs(10),
        "the spawned runner to be stopped",
        !process_alive(runner)
    );
}

#[test]
fn exit_with_parent_never_outlives_a_parent_that_is_already_gone() {
    // The shell starts stallwatch in the background and exits at once: stallwatch either
    // finds no parent to watch at start (exit 1) or sees it die (ordered stop). It must not
    // keep running either way.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let out = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" serve --exit-with-parent --data-dir \"$1\" --otlp-grpc-listen 127.0.0.1:0 --otlp-http-listen 127.0.0.1:0 --dashboard-listen 127.0.0.1:0 >/dev/null 2>\"$1.err\" & echo $!")
        .arg(bin())
        .arg(&d)
        .output()
        .unwrap();
    let pid: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until!(
        Duration::from_secs(30),
        "the orphaned stallwatch to stop",
        !process_alive(pid)
    );
    let err = std::fs::read_to_string(dir.path().join("d.err")).unwrap();
    assert!(
        err.contains("parent"),
        "no word about the parent on stderr: {err}"
    );
}

#[test]
fn shutdown_endpoint_needs_the_token_and_stops_spawned_runners() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(SLEEPER));
    let runner = runner_pid(&format!("http://{}", server.dashboard), "sleeper");
    let r = http_client()
        .post(server.api("/api/v1/shutdown"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http_client()
        .post(server.api("/api/v1/shutdown"))
        .bearer_auth("0".repeat(64))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "a request without the token stopped stallwatch"
    );
    let r = http_client()
        .post(server.api("/api/v1/shutdown"))
        .bearer_auth(server.token())
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let mut code;
    wait_until!(Duration::from_secs(30), "stallwatch to exit", {
        code = server.child.try_wait().unwrap();
        code.is_some()
    });
    assert_eq!(code.unwrap().code(), Some(0));
    assert!(
        !process_alive(runner),
        "spawned runner left running after shutdown"
    );
}

#[test]
fn ingest_token_refuses_exports_without_it_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data"))
            .config("[otlp]\ningest_token = \"s3cret-token\"\n"),
    );
    let body = rich_request([0x31; 16], "tok").encode_to_vec();
    assert_eq!(
        post_protobuf(&server, "/v1/traces", body.clone()).status(),
        401
    );
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .bearer_auth("wrong")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    // gRPC without the token: UNAUTHENTICATED.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async {
        let mut c = opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
        c.export(rich_request([0x32; 16], "tok")).await.unwrap_err().code()
    });
    assert_eq!(code, tonic::Code::Unauthenticated);
    let (_, t) = server.get_json(&format!("/api/v1/traces/{}", "31".repeat(16)));
    assert!(
        t["spans"].as_array().is_none_or(|s| s.is_empty()),
        "refused spans were stored: {t}"
    );
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .bearer_auth("s3cret-token")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let metrics = http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("unauth") && !l.starts_with('#') && !l.ends_with(" 0")),
        "refusals for a missing token not counted:\n{metrics}"
    );
}

#[test]
fn self_traces_show_stallwatch_in_its_own_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts {
        env: vec![("STALLWATCH_SELF_TRACES".into(), "1".into())],
        ..ServerOpts::new(&dir.path().join("data"))
    });
    // Some work to trace.
    assert_eq!(
        post_protobuf(
            &server,
            "/v1/traces",
            rich_request([0x61; 16], "app").encode_to_vec()
        )
        .status(),
        200
    );
    let mut page;
    wait_until!(Duration::from_secs(20), "stallwatch's own traces", {
        page = server.get_json("/api/v1/traces?service=stallwatch").1;
        page["items"].as_array().is_some_and(|i| !i.is_empty())
    });
    let names: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["root_name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.iter().any(|n| n == "stallwatch.ready"), "{names:?}");
    // Without the flag there are none.
    let dir2 = tempfile::tempdir().unwrap();
    let plain = Server::start(&dir2.path().join("data"));
    std::thread::sleep(Duration::from_millis(1200));
    let (_, page) = plain.get_json("/api/v1/traces?service=stallwatch");
    assert_eq!(page["items"].as_array().unwrap().len(), 0, "{page}");
}

#[test]
fn spawned_runners_get_the_ingest_token_so_their_spans_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(
        &crate::chain::chain_config("[otlp]\ningest_token = \"runner-token-1\"\n"),
    ));
    let reg = crate::chain::python_runner(&server, "py-tok", "healthy", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|kv| kv == b"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20runner-token-1"),
        "spawned runner lacks the ingest token header"
    );
    // Its tool spans pass the token check and are stored.
    wait_until!(
        Duration::from_secs(30),
        "the runner's spans stored despite the ingest token",
        {
            server.get_json("/api/v1/traces?tool_name=run_notebook").1["items"]
                .as_array()
                .is_some_and(|i| !i.is_empty())
        }
    );
}

/// A gRPC request body that sends the 5-byte message header (uncompressed, 1,000 bytes) and
/// one byte of the message, then never another frame.
struct StalledGrpcBody {
    sent: bool,
}

impl http_body::Body for StalledGrpcBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.sent {
            return std::task::Poll::Pending;
        }
        self.sent = true;
        let mut data = vec![0u8];
        data.extend_from_slice(&1000u32.to_be_bytes());
        data.push(0x0a);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data.into()))))
    }
}

#[test]
fn clients_stalled_mid_request_do_not_hold_shutdown() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts {
        env: vec![(
            "RUST_LOG".into(),
            "info,stallwatch_storage::listen=debug".into(),
        )],
        ..ServerOpts::new(&dir.path().join("data"))
    });
    let server_stderr = server.stderr_path.clone();
    // A request head cut short, on every listener.
    let mut heads = Vec::new();
    for addr in [server.http, server.grpc, server.dashboard] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        heads.push(s);
    }
    // A whole head, then 1 byte of a 1,000-byte body: to the dashboard's control API (with
    // the token, so the handler reads the body) ...
    let mut dash = TcpStream::connect(server.dashboard).unwrap();
    dash.write_all(
        format!(
            "POST /api/v1/runners HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{",
            server.token()
        )
        .as_bytes(),
    )
    .unwrap();
    // ... and to OTLP/HTTP
    let mut body = TcpStream::connect(server.http).unwrap();
    body.write_all(
        b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n\
          Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\nx",
    )
    .unwrap();
    // the export reaches the collector (its declared body is charged in flight) and waits
    // for the rest of its body
    let inflight = || {
        server
            .metric("stallwatch_otlp_inflight_bytes ")
            .unwrap_or(0)
    };
    wait_until!(
        Duration::from_secs(10),
        "the stalled export to reach the collector",
        inflight() > 0
    );
    let http_charged = inflight();
    // ... and to OTLP/gRPC, one HTTP/2 stream whose message stops after its first byte
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc_addr = server.grpc;
    let grpc = rt.spawn(async move {
        let mut channel = tonic::transport::Channel::from_shared(format!("http://{grpc_addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{grpc_addr}/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(StalledGrpcBody { sent: false }))
            .unwrap();
        let resp = tower::ServiceExt::oneshot(&mut channel, req).await.unwrap();
        let status = resp
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string());
        let message = resp
            .headers()
            .get("grpc-message")
            .map(|v| v.to_str().unwrap().to_string());
        (status, message)
    });
    wait_until!(
        Duration::from_secs(10),
        "the stalled gRPC export to reach the collector",
        inflight() > http_charged
    );
    let t0 = Instant::now();
    assert_eq!(server.stop(), Some(0));
    let took = t0.elapsed();
    // Before: the drain waited for them up to its 10 s deadline (`drain_timeout`), then the
    // dashboard's stalled body up to its 5 s `SHUTDOWN_DEADLINE`.
    assert!(
        took < Duration::from_secs(3),
        "shutdown took {took:?} with stalled clients"
    );
    // The exporters of the stalled bodies are told to retry: nothing of them was stored.
    body.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut resp = String::new();
    let _ = body.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(resp.contains("shutting down"), "{resp}");
    let (status, message) = rt.block_on(grpc).unwrap();
    assert_eq!(
        status.as_deref(),
        Some("14"),
        "gRPC UNAVAILABLE: {message:?}"
    );
    assert!(
        message.as_deref().unwrap_or("").contains("shutting%20down")
            || message.as_deref().unwrap_or("").contains("shutting down"),
        "{message:?}"
    );
    // The dashboard's connection was dropped for its stalled body, not held to the deadline.
    let stderr = std::fs::read_to_string(&server_stderr).unwrap();
    assert!(
        stderr.contains("request bodies stopped arriving at shutdown")
            && stderr.contains("dashboard"),
        "{stderr}"
    );
    drop(heads);
}

#[test]
fn a_second_stop_signal_kills_stopping_runners_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // A runner that ignores SIGTERM (its sleep inherits the ignored disposition), and a
    // grace period far longer than the test.
    let cfg = "[reaper]\ngrace_ms = 60000\nmax_restarts = 0\n\
               [[runner]]\nid = \"stubborn\"\n\
               spawn = { argv = [\"sh\", \"-c\", \"trap '' TERM; sleep 300\"] }\n";
    let mut server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(cfg));
    let runner = runner_pid(&format!("http://{}", server.dashboard), "stubborn");
    let pid = server.child.id().to_string();
    let kill_term = || {
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success())
    };
    kill_term();
    wait_until!(Duration::from_secs(10), "the shutdown to begin", {
        server.stderr().contains("shutting down")
    });
    // One signal: the runner is in its grace period, still alive, and so is stallwatch.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        process_alive(runner),
        "the runner was killed before its grace period ended"
    );
    assert!(server.child.try_wait().unwrap().is_none());
    // The second: SIGKILL now, and stallwatch exits (before: the stage deadline, 30 s).
    let t0 = std::time::Instant::now();
    kill_term();
    let code = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "stallwatch still running 10 s after the second SIGTERM; stderr:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    assert_eq!(code, Some(0), "{}", server.stderr());
    assert!(!process_alive(runner), "the runner outlived stallwatch");
    let stderr = server.stderr();
    assert!(stderr.contains("second stop signal"), "{stderr}");
    eprintln!("stopped {took:?} after the second SIGTERM");
    // Before: 2 s more, waiting to reap a runner its exit monitor had already reaped.
    assert!(took < Duration::from_millis(1500), "{took:?}\n{stderr}");
    // The kill asked for is not reported as the runner crashing.
    drop(server);
    let again = Server::start(&dir.path().join("data"));
    let (status, v) = again.get_json("/api/v1/incidents?runner_id=stubborn&limit=100");
    assert_eq!(status, 200, "{v}");
    let events: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["event"].as_str())
        .collect();
    eprintln!("incidents of the runner: {events:?}");
    assert!(!events.contains(&"runner.crashed"), "{events:?}");
    // The hurried sequence sent the SIGKILL itself, recorded as its step: its record says
    // so, with the SIGTERM and the grace before it (it said "already_exited", with no
    // SIGKILL, when the SIGKILL came from outside the sequence).
    let terminated = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["event"] == "runner.terminated")
        .unwrap_or_else(|| panic!("no runner.terminated: {v:#}"));
    let report = &terminated["evidence"]["report"];
    assert_eq!(report["ended_by"], "sigkill", "{terminated:#}");
    assert!(report["sigkill_unix_nano"].is_u64(), "{terminated:#}");
    let steps: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["step"].as_str())
        .collect();
    let at = |name: &str| steps.iter().position(|s| *s == name);
    assert!(
        at("sigterm_sent").is_some() && at("sigterm_sent") < at("sigkill_sent"),
        "{steps:?}"
    );
}

/// `timeout(1)` sends its signal to stallwatch and then to its process group: two SIGTERMs
/// a moment apart are one request, an ordered shutdown with the runners' grace period. They
/// were taken for a user pressing Ctrl-C twice: the runners got SIGKILL at once.
#[test]
fn two_stop_signals_a_moment_apart_are_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = "[reaper]\ngrace_ms = 3000\nmax_restarts = 0\n\
               [[runner]]\nid = \"stubborn\"\n\
               spawn = { argv = [\"sh\", \"-c\", \"trap '' TERM; sleep 300\"] }\n";
    let mut server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(cfg));
    let runner = runner_pid(&format!("http://{}", server.dashboard), "stubborn");
    let pid = server.child.id().to_string();
    for _ in 0..2 {
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_until!(Duration::from_secs(10), "the shutdown to begin", {
        server.stderr().contains("shutting down")
    });
    // In the grace period (3 s) a second later: the runner was not hurried to its end.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        process_alive(runner),
        "SIGKILLed at once:\n{}",
        server.stderr()
    );
    let t0 = std::time::Instant::now();
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!process_alive(runner));
    let log = server.stderr();
    assert!(!log.contains("second stop signal"), "{log}");
}
