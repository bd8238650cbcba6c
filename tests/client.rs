//! The Rust client crate (`stallwatch-client`) against the real binary: port discovery from
//! the ready line and token file, every typed call, admission, checkpoints, the event
//! stream with `Last-Event-ID`, and the sidecar launcher's ordered shutdown.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stallwatch_client::{
    BreakerState, Client, Error, Event, EventStream, IncidentQuery, ReadyLine, RunnerSpec, Sidecar,
    SidecarOptions,
};

use crate::support::{Server, ServerOpts};

/// Generous deadline for asynchronous effects on a loaded 2-core box.
const DEADLINE: Duration = Duration::from_secs(30);

fn client_of(server: &Server) -> Client {
    let ready = ReadyLine::parse(&server.ready.to_string()).unwrap();
    assert_eq!(ready.dashboard, server.dashboard);
    assert_eq!(ready.otlp_grpc, server.grpc);
    assert_eq!(ready.otlp_http, server.http);
    Client::from_ready(&ready).unwrap()
}

/// A `sleep 30` child in its own process group, reaped by a thread as soon as it exits
/// (stallwatch is not its parent). Answers its pid and a receiver of its exit status.
fn sleeper() -> (u32, mpsc::Receiver<std::process::ExitStatus>) {
    let mut child = Command::new("sleep")
        .arg("30")
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let st = child.wait().unwrap();
        let _ = tx.send(st);
    });
    (pid, rx)
}

/// Next event of `stream` within the deadline.
async fn next_event(stream: &mut EventStream) -> Event {
    tokio::time::timeout(DEADLINE, stream.next_event())
        .await
        .expect("no event within the deadline")
        .expect("event stream ended")
        .unwrap()
}

/// The first event named `name` on `stream` (others are skipped, at most 20).
async fn until(stream: &mut EventStream, name: &str) -> Event {
    let mut seen = vec![];
    loop {
        let ev = next_event(stream).await;
        if ev.event == name {
            return ev;
        }
        seen.push(ev.event);
        assert!(seen.len() < 20, "no {name} among {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_unknown_runner_and_wrong_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let client = client_of(&server);

    match client.admit("ghost").await {
        Err(Error::UnknownRunner(id)) => assert_eq!(id, "ghost"),
        other => panic!("admit of an unknown runner: {other:?}"),
    }
    assert!(matches!(
        client.delete_runner("ghost").await,
        Err(Error::UnknownRunner(_))
    ));

    let wrong = Client::new(server.dashboard, "0".repeat(64)).unwrap();
    let spec = RunnerSpec::attached("intruder", std::process::id(), None);
    assert!(matches!(
        wrong.register_runner(&spec).await,
        Err(Error::Unauthorized)
    ));
    assert!(matches!(
        wrong.create_checkpoint("intruder", dir.path()).await,
        Err(Error::Unauthorized)
    ));
    assert!(matches!(wrong.shutdown().await, Err(Error::Unauthorized)));
    // Nothing was done: the runner is unknown and the server still answers.
    assert!(matches!(
        client.admit("intruder").await,
        Err(Error::UnknownRunner(_))
    ));
    assert!(client.runners().await.unwrap().is_empty());
    // A bad spec is the server's 400 with its code.
    let bad = RunnerSpec {
        attach: None,
        ..RunnerSpec::attached("both-missing", 2, None)
    };
    match client.register_runner(&bad).await {
        Err(Error::Http { status, code, .. }) => {
            assert_eq!(status, 400);
            assert_eq!(code, "invalid_runner");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_attached_runner_admitted_then_checkpoints_then_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let client = client_of(&server);
    let (pid, exited) = sleeper();

    let reply = client.attach_runner("sleeper", pid, None).await.unwrap();
    assert_eq!(reply["pid"], pid);
    assert_eq!(reply["signalled_on_trip"], true, "{reply}");

    // The watchdog learns of the runner through a channel: poll admission until CLOSED.
    let deadline = Instant::now() + DEADLINE;
    let admission = loop {
        match client.admit("sleeper").await {
            Ok(a) if a.admit => break a,
            Ok(_) | Err(Error::UnknownRunner(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("sleeper never admitted: {other:?}"),
        }
    };
    assert_eq!(admission.state, BreakerState::Closed);
    assert_eq!(admission.retry_after_ms, None);
    let runners = client.runners().await.unwrap();
    let me = runners.iter().find(|r| r.id == "sleeper").unwrap();
    assert_eq!(me.pid, Some(pid));
    assert!(!me.spawned);
    assert_eq!(
        client.runner("sleeper").await.unwrap().breaker,
        BreakerState::Closed
    );

    // Same id, still alive → 409.
    assert!(matches!(
        client.attach_runner("sleeper", pid, None).await,
        Err(Error::Conflict { .. })
    ));

    // Checkpoint committed: the staged file lands in the workspace, staging is gone.
    let ws = dir.path().join("workspace");
    std::fs::create_dir(&ws).unwrap();
    let cp = client.create_checkpoint("sleeper", &ws).await.unwrap();
    assert!(cp.path.starts_with(&ws), "{cp:?}");
    assert!(cp.path.is_dir());
    std::fs::write(cp.path.join("result.csv"), "a,b\n1,2\n").unwrap();
    let done = client.commit_checkpoint(&cp.id).await.unwrap();
    assert_eq!(
        (done.id.as_str(), done.state.as_str()),
        (cp.id.as_str(), "committed")
    );
    assert_eq!(done.files, Some(1));
    assert_eq!(
        std::fs::read_to_string(ws.join("result.csv")).unwrap(),
        "a,b\n1,2\n"
    );
    assert!(!cp.path.exists());

    // Checkpoint rolled back: nothing reaches the workspace.
    let cp2 = client.create_checkpoint("sleeper", &ws).await.unwrap();
    assert_ne!(cp2.id, cp.id);
    std::fs::write(cp2.path.join("half-written.bin"), [0u8; 16]).unwrap();
    let undone = client.rollback_checkpoint(&cp2.id).await.unwrap();
    assert_eq!(undone.state, "rolled_back");
    assert!(!ws.join("half-written.bin").exists());
    assert!(!cp2.path.exists());

    // A relative workspace is refused with the server's code.
    match client.create_checkpoint("sleeper", "rel".as_ref()).await {
        Err(Error::Http {
            status: 400, code, ..
        }) => assert_eq!(code, "invalid_workspace"),
        other => panic!("{other:?}"),
    }

    // DELETE terminates the attached runner (its start time was given) and reports.
    let report = client.delete_runner("sleeper").await.unwrap();
    assert_eq!(report["removed"], true, "{report}");
    let status = exited
        .recv_timeout(DEADLINE)
        .expect("sleeper still running");
    assert!(!status.success(), "{status:?}");
    let terminated = client
        .incidents(&IncidentQuery {
            runner_id: Some("sleeper".into()),
            event: Some("runner.terminated".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(terminated.items.len(), 1, "{terminated:?}");
    assert_eq!(terminated.items[0].event, "runner.terminated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refused_admission_carries_the_retry_hint() {
    // A runner whose heartbeat socket does not exist: heartbeat lost, nothing open → trip.
    // No start time is given, so it is watched but never signalled and stays registered.
    let dir = tempfile::tempdir().unwrap();
    let config = "[watchdog]\nheartbeat_interval_ms = 100\nheartbeat_timeout_ms = 500\n\
                  startup_grace_ms = 300\nbreaker_cooldown_ms = 60000\ntick_ms = 25\n";
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(config));
    let client = client_of(&server);
    let (pid, _exited) = sleeper();
    let mut events = client.events(None).await.unwrap();
    let mut spec = RunnerSpec::attached("mute", pid, None);
    spec.heartbeat_socket = Some(dir.path().join("nobody-listens.sock"));
    let reply = client.register_runner(&spec).await.unwrap();
    assert_eq!(reply["signalled_on_trip"], false, "{reply}");

    let deadline = Instant::now() + DEADLINE;
    let refused = loop {
        match client.admit("mute").await {
            Ok(a) if !a.admit => break a,
            Ok(_) | Err(Error::UnknownRunner(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("mute never refused: {other:?}"),
        }
    };
    assert_eq!(refused.state, BreakerState::Open, "{refused:?}");
    let retry = refused
        .retry_after()
        .expect("a refusal carries retry_after_ms");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(60),
        "{retry:?}"
    );
    assert!(!refused.reason.is_empty());
    let opened = until(&mut events, "breaker.opened")
        .await
        .incident()
        .unwrap();
    assert_eq!(opened.runner_id.as_deref(), Some("mute"));

    client.reset_breaker("mute").await.unwrap();
    assert!(matches!(
        client.reset_breaker("ghost").await,
        Err(Error::UnknownRunner(_))
    ));
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_events_stream_runner_incidents_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let client = client_of(&server);

    let mut live = client.events(None).await.unwrap();
    let spec = RunnerSpec::spawned("evented", vec!["sleep".into(), "30".into()]);
    let reply = client.register_runner(&spec).await.unwrap();
    assert_eq!(reply["id"], "evented", "{reply}");
    let started = until(&mut live, "runner.started").await;
    let inc = started.incident().unwrap();
    assert_eq!(inc.runner_id.as_deref(), Some("evented"));
    assert_eq!(started.id, Some(inc.id));

    client.delete_runner("evented").await.unwrap();
    let terminated = until(&mut live, "runner.terminated").await;
    let t = terminated.incident().unwrap();
    assert_eq!(t.runner_id.as_deref(), Some("evented"));
    assert!(t.id > inc.id);
    assert!(live.last_event_id() >= Some(t.id));

    // Resuming with Last-Event-ID replays what came after that id, in order.
    let mut resumed = client.events(Some(inc.id - 1)).await.unwrap();
    let first = next_event(&mut resumed).await;
    assert_eq!(first.id, Some(inc.id));
    assert_eq!(first.event, "runner.started");

    // The incident list shows the same events.
    let page = client
        .incidents(&IncidentQuery {
            runner_id: Some("evented".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<i64> = page.items.iter().map(|i| i.id).collect();
    assert!(ids.contains(&inc.id) && ids.contains(&t.id), "{ids:?}");

    // events_from follows across a reconnection from a given id.
    let mut follow = client.events_from(Some(inc.id - 1));
    let ev = tokio::time::timeout(DEADLINE, follow.next_event())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.id, Some(inc.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sidecar_spawn_and_ordered_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = SidecarOptions::new(env!("CARGO_BIN_EXE_stallwatch"));
    options.data_dir = Some(dir.path().join("data"));
    options.exit_with_parent = true;
    options.stderr_file = Some(dir.path().join("stderr.log"));
    let sidecar = Sidecar::spawn(options).await.unwrap();
    assert_eq!(
        std::fs::canonicalize(&sidecar.ready().data_dir).unwrap(),
        std::fs::canonicalize(dir.path().join("data")).unwrap()
    );
    assert_ne!(sidecar.ready().dashboard.port(), 0);
    assert!(sidecar.pid().is_some());
    let client = sidecar.client().clone();
    assert!(client.runners().await.unwrap().is_empty());
    assert!(matches!(
        client.admit("nobody").await,
        Err(Error::UnknownRunner(_))
    ));

    let status = sidecar.shutdown().await.unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "stderr:\n{}",
        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
    );
    // Gone: the dashboard no longer answers.
    assert!(matches!(client.runners().await, Err(Error::Transport(_))));
}
