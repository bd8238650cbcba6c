//! What the workbench's Tauri backend does with stallwatch, as plain async functions named
//! like the Tauri commands they would be (no tauri dependency here: in the app, each
//! `cmd_*` gets `#[tauri::command]` and `State<'_, AppState>` instead of `&AppState`).
//!
//! 1. `setup`: start the sidecar with `exit_with_parent` (if the app is killed, stallwatch
//!    still stops its runners in order), and follow its events for the web view;
//! 2. `cmd_start_python_runner`: register a Python MCP tool runner that stallwatch spawns
//!    (it injects the heartbeat socket, OTLP endpoint and checkpoint folder);
//! 3. `cmd_call_tool`: before each MCP request, ask admission and refuse with the retry hint
//!    when the runner's breaker is not CLOSED; open a checkpoint, dispatch, then commit on
//!    success or roll back on failure;
//! 4. `shutdown`: ordered shutdown when the app quits.
//!
//! Run: `cargo build -p stallwatch && cargo run -p stallwatch-client --example tauri_commands --
//! "${CARGO_TARGET_DIR:-target}/debug/stallwatch"`

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stallwatch_client::{Client, Error, Incident, RunnerSpec, Sidecar, SidecarOptions};
use tokio::sync::Mutex;

/// What the app keeps in Tauri's managed state.
struct AppState {
    sidecar: Mutex<Option<Sidecar>>,
    client: Client,
    workspace: PathBuf,
}

/// The answer of `cmd_call_tool` to the web view.
#[derive(Debug, serde::Serialize)]
struct ToolReply {
    runner_id: String,
    checkpoint_id: String,
    files_committed: u64,
    output: String,
}

/// Errors cross to the web view as strings; the admission refusal carries the retry hint.
type CmdResult<T> = Result<T, String>;

/// Tauri `setup` hook: start stallwatch next to the app and follow its events.
async fn setup(binary: PathBuf, data_dir: PathBuf, workspace: PathBuf) -> CmdResult<Arc<AppState>> {
    let mut options = SidecarOptions::new(binary);
    options.data_dir = Some(data_dir);
    options.exit_with_parent = true;
    let sidecar = Sidecar::spawn(options)
        .await
        .map_err(|e| format!("cannot start stallwatch: {e}"))?;
    println!(
        "stallwatch ready: dashboard {} (OTLP/HTTP {})",
        sidecar.client().dashboard_url(),
        sidecar.ready().otlp_http_endpoint()
    );
    let state = Arc::new(AppState {
        client: sidecar.client().clone(),
        sidecar: Mutex::new(Some(sidecar)),
        workspace,
    });
    follow_events(state.client.clone(), |incident| {
        // In the app: `app_handle.emit("stallwatch://incident", &incident)`.
        println!(
            "event {} #{} runner={:?}: {}",
            incident.event, incident.id, incident.runner_id, incident.reason
        );
    });
    Ok(state)
}

/// Forwards every incident to `emit`, reconnecting (with `Last-Event-ID`) if the stream
/// drops; stops when the token is refused.
fn follow_events(client: Client, emit: impl Fn(Incident) + Send + 'static) {
    tokio::spawn(async move {
        let mut events = client.events_from(None);
        while let Some(ev) = events.next_event().await {
            match ev.and_then(|e| e.incident()) {
                Ok(incident) => emit(incident),
                Err(Error::Unauthorized) => break,
                Err(e) => eprintln!("event stream: {e}"),
            }
        }
    });
}

/// `#[tauri::command] cmd_start_python_runner`: stallwatch spawns `python3 <script>` as
/// runner `runner_id`, with the checkpoint workspace.
async fn cmd_start_python_runner(
    state: &AppState,
    runner_id: String,
    script: PathBuf,
) -> CmdResult<serde_json::Value> {
    let mut spec = RunnerSpec::spawned(
        runner_id,
        vec!["python3".into(), script.display().to_string()],
    );
    if let Some(spawn) = spec.spawn.as_mut() {
        spawn.workspace = Some(state.workspace.clone());
        spawn
            .env
            .insert("OTEL_SERVICE_NAME".into(), "workbench-tools".into());
    }
    match state.client.register_runner(&spec).await {
        Ok(v) => Ok(v),
        Err(Error::Conflict { message, .. }) => Err(format!("already running: {message}")),
        Err(e) => Err(e.to_string()),
    }
}

/// `#[tauri::command] cmd_call_tool`: one MCP `tools/call`, guarded by admission and a
/// checkpoint.
async fn cmd_call_tool(
    state: &AppState,
    runner_id: String,
    tool: String,
    arguments: serde_json::Value,
) -> CmdResult<ToolReply> {
    let client = &state.client;
    // 1. Admission: never dispatch to a runner whose breaker is OPEN or HALF_OPEN.
    let admission = client.admit(&runner_id).await.map_err(|e| match e {
        Error::UnknownRunner(id) => format!("runner {id} is not registered"),
        other => other.to_string(),
    })?;
    if !admission.admit {
        return Err(format!(
            "runner {runner_id} is {:?} ({}); retry in {} ms",
            admission.state,
            admission.reason,
            admission.retry_after_ms.unwrap_or(1000)
        ));
    }
    // 2. Checkpoint: the tool writes into the staging folder, never the workspace.
    let cp = client
        .create_checkpoint(&runner_id, &state.workspace)
        .await
        .map_err(|e| e.to_string())?;
    // 3. Dispatch; 4. commit on success, roll back on failure.
    match dispatch_mcp(&tool, &arguments, &cp.path).await {
        Ok(output) => {
            let done = client
                .commit_checkpoint(&cp.id)
                .await
                .map_err(|e| e.to_string())?;
            Ok(ToolReply {
                runner_id,
                checkpoint_id: cp.id,
                files_committed: done.files.unwrap_or(0),
                output,
            })
        }
        Err(err) => {
            if let Err(e) = client.rollback_checkpoint(&cp.id).await {
                eprintln!("rollback of {} failed: {e}", cp.id);
            }
            Err(format!("tool {tool} failed: {err}"))
        }
    }
}

/// Stand-in for the app's MCP client: a real one sends `tools/call` to the runner with
/// `STALLWATCH_CHECKPOINT_DIR` pointing at `staging`. Here the "tool" writes its result.
async fn dispatch_mcp(
    tool: &str,
    arguments: &serde_json::Value,
    staging: &Path,
) -> Result<String, String> {
    if tool == "fail" {
        return Err("the tool raised".into());
    }
    let out = format!("{tool}({arguments})");
    tokio::fs::write(staging.join(format!("{tool}.txt")), &out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Tauri `RunEvent::ExitRequested`: ordered shutdown (spawned runners are stopped first).
async fn shutdown(state: &AppState) -> CmdResult<()> {
    if let Some(sidecar) = state.sidecar.lock().await.take() {
        let status = sidecar.shutdown().await.map_err(|e| e.to_string())?;
        println!("stallwatch exited: {status}");
    }
    Ok(())
}

const RUNNER_PY: &str = r#"
import os, socket, threading, time
path = os.environ["STALLWATCH_HEARTBEAT_SOCKET"]
try: os.unlink(path)
except FileNotFoundError: pass
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(8)
def serve():
    while True:
        c, _ = s.accept()
        if c.recv(64).startswith(b"PING"): c.sendall(b"PONG\n")
        c.close()
threading.Thread(target=serve, daemon=True).start()
while True: time.sleep(1)
"#;

#[tokio::main]
async fn main() -> Result<(), String> {
    let Some(binary) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: tauri_commands <path to the stallwatch binary>");
        return Ok(());
    };
    let tmp = std::env::temp_dir().join(format!("stallwatch-example-{}", std::process::id()));
    let workspace = tmp.join("workspace");
    std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
    let script = tmp.join("runner.py");
    std::fs::write(&script, RUNNER_PY).map_err(|e| e.to_string())?;

    let state = setup(binary, tmp.join("data"), workspace.clone()).await?;
    let started = cmd_start_python_runner(&state, "py-tools".into(), script).await?;
    println!("runner registered: {started}");
    // The watchdog learns about the runner asynchronously; admission says when it may be used.
    for _ in 0..50 {
        match cmd_call_tool(
            &state,
            "py-tools".into(),
            "plot".into(),
            serde_json::json!({"n": 3}),
        )
        .await
        {
            Ok(reply) => {
                println!("tool answered: {reply:?}");
                break;
            }
            Err(e) => {
                println!("not yet: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    match cmd_call_tool(
        &state,
        "py-tools".into(),
        "fail".into(),
        serde_json::json!({}),
    )
    .await
    {
        Ok(r) => println!("unexpected success: {r:?}"),
        Err(e) => println!("as expected: {e} (checkpoint rolled back)"),
    }
    shutdown(&state).await?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
