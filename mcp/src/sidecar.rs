//! The wrapper's side of the sidecar's public API: discovery through
//! `<data_dir>/ready.json`, registration of the server as an attached runner, the live
//! event stream (trips), and admission (docs/design.md, Interfaces: Control endpoints).

use std::path::{Path, PathBuf};
use std::time::Duration;

use stallwatch_client::{Client, ClientOptions, ReadyLine, RunnerSpec};
use tokio::sync::mpsc;

/// How long a re-registration may be refused with 409 (the old process is still being
/// terminated) before the wrapper gives up registering this incarnation.
pub const REGISTER_RETRY_FOR: Duration = Duration::from_secs(15);
/// Poll period of admission while the breaker is not CLOSED.
pub const ADMIT_POLL: Duration = Duration::from_millis(250);

/// A running sidecar found through its data folder.
#[derive(Clone)]
pub struct Sidecar {
    /// The ready line read from `ready.json`.
    pub ready: ReadyLine,
    /// Control API client (bearer token from `<data_dir>/token`).
    pub client: Client,
}

/// Reads `<data_dir>/ready.json` and the token, and checks the dashboard answers. Answers
/// why not when there is no usable sidecar (the wrapper then relays without one).
pub async fn discover(data_dir: &Path) -> Result<Sidecar, String> {
    let path = data_dir.join("ready.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let ready = ReadyLine::parse(&text).map_err(|e| e.to_string())?;
    let options = ClientOptions {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
    };
    let client = Client::from_ready_with(&ready, options).map_err(|e| e.to_string())?;
    client
        .runners()
        .await
        .map_err(|e| format!("the sidecar at {} does not answer: {e}", ready.dashboard))?;
    Ok(Sidecar { ready, client })
}

/// The data folder exactly as `serve` chooses it: `--data-dir`, else `STALLWATCH_DATA_DIR`
/// (clap reads it into the same flag), else `$XDG_DATA_HOME/stallwatch`, else
/// `~/.local/share/stallwatch`.
pub fn default_data_dir() -> Option<PathBuf> {
    // a relative XDG_DATA_HOME is ignored (XDG Base Directory Specification), as by `serve`
    if let Some(x) = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty() && std::path::Path::new(v).is_absolute())
    {
        return Some(PathBuf::from(x).join("stallwatch"));
    }
    let home = std::env::var_os("HOME").filter(|v| !v.is_empty())?;
    Some(PathBuf::from(home).join(".local/share/stallwatch"))
}

/// Registers process `pid` as attached runner `id` with its start time (so stallwatch may
/// signal it) and `socket`, retrying a 409 (the previous process of the same id is still
/// being terminated) for up to [`REGISTER_RETRY_FOR`].
pub async fn register(sidecar: &Sidecar, id: &str, pid: u32, socket: &Path) -> Result<(), String> {
    let ticks = stallwatch_client::process_start_time_ticks(pid).map_err(|e| e.to_string())?;
    let mut spec = RunnerSpec::attached(id, pid, Some(ticks));
    spec.heartbeat_socket = Some(socket.to_path_buf());
    let deadline = tokio::time::Instant::now() + REGISTER_RETRY_FOR;
    loop {
        match sidecar.client.register_runner(&spec).await {
            Ok(_) => return Ok(()),
            Err(stallwatch_client::Error::Conflict { .. })
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// What the event stream and admission tell the relay about this runner.
#[derive(Debug, Clone, PartialEq)]
pub enum BreakerNews {
    /// The breaker opened (a trip) or the runner was terminated.
    Tripped {
        /// Verdict from the incident's evidence (`tool_overrun`, `unresponsive`, ...).
        verdict: String,
        /// The incident's reason.
        reason: String,
        /// Ms until admission could succeed (from admission; 0 when unknown).
        retry_after_ms: u64,
    },
    /// Admission answered: still refused, with the remaining wait.
    Refused {
        /// `OPEN` or `HALF_OPEN`.
        state: String,
        /// Why.
        reason: String,
        /// Ms until admission could succeed.
        retry_after_ms: u64,
    },
    /// Admission succeeds again (breaker CLOSED).
    Closed,
}

/// Follows `/api/v1/events` and sends [`BreakerNews`] for runner `id`: `breaker.opened` and
/// `runner.terminated` become `Tripped` (with `retry_after_ms` from admission),
/// `breaker.closed` becomes `Closed`. Runs until `tx` is closed.
pub async fn follow_events(sidecar: Sidecar, id: String, tx: mpsc::UnboundedSender<BreakerNews>) {
    let mut events = sidecar.client.events_from(None);
    while let Some(ev) = events.next_event().await {
        let Ok(ev) = ev else {
            if tx.is_closed() {
                return;
            }
            continue;
        };
        let Ok(inc) = ev.incident() else { continue };
        if inc.runner_id.as_deref() != Some(id.as_str()) {
            continue;
        }
        let news = match inc.event.as_str() {
            "breaker.opened" | "runner.terminated" => {
                let verdict = inc
                    .evidence
                    .get("verdict")
                    .and_then(|v| v.as_str())
                    .unwrap_or(if inc.event == "runner.terminated" {
                        "terminated"
                    } else {
                        "tripped"
                    })
                    .to_string();
                let retry_after_ms = match sidecar.client.admit(&id).await {
                    Ok(a) => a.retry_after_ms.unwrap_or(0),
                    Err(_) => 0,
                };
                BreakerNews::Tripped {
                    verdict,
                    reason: inc.reason.clone(),
                    retry_after_ms,
                }
            }
            "breaker.closed" => BreakerNews::Closed,
            _ => continue,
        };
        if tx.send(news).is_err() {
            return;
        }
    }
}

/// While the relay believes the breaker is not CLOSED, polls admission every
/// [`ADMIT_POLL`] and reports what it says. `want` carries `true` while polling is wanted.
pub async fn poll_admission(
    sidecar: Sidecar,
    id: String,
    mut want: tokio::sync::watch::Receiver<bool>,
    tx: mpsc::UnboundedSender<BreakerNews>,
) {
    loop {
        while !*want.borrow_and_update() {
            if want.changed().await.is_err() {
                return;
            }
        }
        let news = match sidecar.client.admit(&id).await {
            Ok(a) if a.admit => BreakerNews::Closed,
            Ok(a) => BreakerNews::Refused {
                state: format!("{:?}", a.state),
                reason: a.reason,
                retry_after_ms: a.retry_after_ms.unwrap_or(0),
            },
            Err(stallwatch_client::Error::UnknownRunner(_)) => BreakerNews::Closed,
            Err(_) => {
                tokio::time::sleep(ADMIT_POLL).await;
                continue;
            }
        };
        if tx.send(news).is_err() {
            return;
        }
        tokio::time::sleep(ADMIT_POLL).await;
    }
}
