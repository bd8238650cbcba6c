//! Shared harness: a storage file in a temp folder, a started reaper, its channels.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stallwatch_reaper::{Reaper, ReaperConfig, ReaperHandle};
use stallwatch_storage::control::{ControlRequest, RunnerChange, RunnerSpec, SpawnSpec, Trip};
pub use stallwatch_storage::control::{RegisterError, RunnerError};
use stallwatch_storage::model::{EventKind, Incident};
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub storage: Storage,
    pub events: EventBus,
    pub incidents: broadcast::Receiver<Incident>,
    pub handle: ReaperHandle,
    pub task: tokio::task::JoinHandle<()>,
    pub trips: mpsc::Sender<Trip>,
    pub changes: mpsc::Receiver<RunnerChange>,
    pub shutdown: CancellationToken,
}

pub fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name)
}

/// `STALLWATCH_TEST_PYTHON`, else `/work/main/.venv/bin/python`, else `python3`.
pub fn python() -> String {
    if let Ok(p) = std::env::var("STALLWATCH_TEST_PYTHON") {
        return p;
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.exists() {
        return venv.to_string_lossy().into_owned();
    }
    "python3".into()
}

pub fn config(dir: &Path, grace_ms: u64) -> ReaperConfig {
    let mut c = ReaperConfig::new(dir.to_path_buf());
    c.grace = Duration::from_millis(grace_ms);
    c.zombie_interval = Duration::from_millis(100);
    c
}

pub async fn harness_with(dir: tempfile::TempDir, config: ReaperConfig) -> Harness {
    let storage = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
    let events = EventBus::new(storage.clone());
    let incidents = events.subscribe();
    let (trips, trip_rx) = mpsc::channel(16);
    let (change_tx, changes) = mpsc::channel(1024);
    let shutdown = CancellationToken::new();
    let (handle, task) = Reaper::start(
        config,
        storage.clone(),
        events.clone(),
        trip_rx,
        change_tx,
        shutdown.clone(),
    )
    .await
    .unwrap();
    Harness {
        dir,
        storage,
        events,
        incidents,
        handle,
        task,
        trips,
        changes,
        shutdown,
    }
}

pub async fn harness(grace_ms: u64) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), grace_ms);
    harness_with(dir, cfg).await
}

pub fn spawn_spec(id: &str, argv: &[&str]) -> RunnerSpec {
    RunnerSpec {
        id: id.into(),
        heartbeat_socket: None,
        spawn: Some(SpawnSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: Default::default(),
            workspace: None,
        }),
        attach: None,
    }
}

impl Harness {
    /// Ends the reaper as the sidecar's ordered shutdown does: every spawned runner still
    /// registered is stopped, a restarted instance included. A test that trips a spawned
    /// runner and does not delete it must end with this: the restart policy starts it
    /// again, and without it that instance outlived the test (one GUI-blocked Python per
    /// run of the suite, found re-parented to init).
    pub async fn close(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the reaper stopped within 60 s")
            .expect("the reaper task ended without a panic");
    }

    /// Registers `spec`; a success is answered as its JSON body.
    pub async fn register(&self, spec: RunnerSpec) -> Result<serde_json::Value, RegisterError> {
        let (reply, rx) = oneshot::channel();
        self.handle
            .handle(ControlRequest::RegisterRunner { spec, reply })
            .await;
        rx.await.unwrap().map(|r| serde_json::to_value(r).unwrap())
    }
    /// Deletes runner `id`; a success is answered as its JSON body.
    pub async fn delete(&self, id: &str) -> Result<serde_json::Value, RunnerError> {
        let (reply, rx) = oneshot::channel();
        self.handle
            .handle(ControlRequest::DeleteRunner {
                id: id.into(),
                reply,
            })
            .await;
        rx.await.unwrap().map(|r| serde_json::to_value(r).unwrap())
    }
    pub async fn trip(&self, id: &str) {
        self.trips
            .send(Trip {
                runner_id: id.into(),
                verdict: "tool_overrun".into(),
                reason: "test trip".into(),
                incident_id: None,
                open_spans: vec![],
                at_unix_nano: stallwatch_storage::model::now_unix_nano(),
            })
            .await
            .unwrap();
    }
    /// Waits (up to 30 s) for an incident of `kind` about `runner`.
    pub async fn incident(&mut self, kind: EventKind, runner: &str) -> Incident {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.incidents.recv()).await {
                Ok(Ok(i))
                    if i.incident.kind == kind
                        && i.incident.runner_id.as_deref() == Some(runner) =>
                {
                    return i
                }
                Ok(Ok(_)) => continue,
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(e)) => panic!("event bus closed: {e}"),
                Err(_) => panic!("no {kind} incident for {runner} within 30 s"),
            }
        }
    }
    /// Waits (up to 20 s) until the runner printed a stdout line containing `needle`.
    pub async fn output(&self, id: &str, needle: &str) {
        wait_for(&format!("{id} prints {needle:?}"), || {
            self.handle
                .runner_output(id, "stdout")
                .iter()
                .any(|l| l.contains(needle))
        })
        .await;
    }
}

/// Polls `cond` every 20 ms until it holds; panics after 30 s.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True when `pid` exists and is not a zombie.
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string));
            state.as_deref() != Some("Z")
        }
        Err(_) => false,
    }
}

/// Zombie processes whose parent is this test process.
pub fn our_zombies() -> Vec<u32> {
    stallwatch_reaper::platform::zombie_children()
}
