//! The relay: one task owns all state (in-flight requests and their spans, the server
//! process, the breaker as last heard) and reacts to one event at a time; readers and
//! writers of both pipes are separate tasks, so a server that stops reading its stdin never
//! blocks an answer to the client.
//!
//! Lines are relayed byte for byte (MCP spec, Transports: stdio: newline-delimited JSON-RPC
//! messages, no embedded newlines). The wrapper's own messages to the server are `ping`
//! requests with ids `"stallwatch-ping-<session>-<n>"` (`<session>`: 8 random hex digits
//! of this wrapper run, so a client's own ids never collide with them) and the replayed
//! `initialize` with id `"stallwatch-init-<generation>"`; their answers are never shown to
//! the client, however late they come.
//!
//! A JSON-RPC batch (an array on one line) is relayed as it came, its requests tracked one
//! by one; it is re-written only to take out what must not pass: a `tools/call` the open
//! breaker refuses, answers to the wrapper's own requests or to requests already answered
//! in the server's place. Answers given in the server's place to a batch's requests go back
//! as one batch.
//!
//! This file holds the state and the event loop; each kind of event is handled in its own
//! module: `client.rs` (requests from the client, admission, answers in the server's place),
//! `answers.rs` (lines from the server, pings), `breaker.rs` (the sidecar's breaker news),
//! `server.rs` (the server process: spawn, register, stop, restart) and `pipes.rs` (line
//! readers and writers, exit codes, stop signals).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{WrapConfig, SLA_META_KEY};
use crate::error::Error;
use crate::heartbeat::{self, Health, HealthView};
use crate::jsonrpc::{self, Kind};
use crate::sidecar::{self, BreakerNews, Sidecar};
use crate::spans::{Exporter, McpSpan, Resource};

mod answers;
mod breaker;
mod client;
mod pipes;
mod server;

use breaker::verdict_and_reason;
use pipes::{exit_code_of, read_lines, write_lines, Signals};

/// JSON-RPC error code of every answer the wrapper gives in the server's place: a request
/// in flight when stallwatch tripped the runner's breaker or the server died, and a
/// `tools/call` refused while the breaker is OPEN or HALF_OPEN. In the range JSON-RPC 2.0
/// §5.1 leaves to implementations (-32000 to -32099). The message names the verdict and
/// the reason; `data` is `{"runner_id", "verdict", "retry_after_ms"}`.
pub const TRIPPED_ERROR_CODE: i64 = -32001;

/// How long a server exit waits for the trip that may explain it (the sidecar's
/// `breaker.opened` event can arrive just after its SIGTERM) before in-flight requests are
/// answered as a crash.
pub const EXIT_EXPLAIN_WAIT: Duration = Duration::from_millis(300);
/// Deadline of the admission check of a `tools/call` while the breaker is not CLOSED.
pub const ADMIT_DEADLINE: Duration = Duration::from_millis(500);
/// Most outstanding wrapper pings remembered for their send times (an answer to an older
/// one is still recognized by its id's prefix, and kept from the client).
const MAX_PINGS: usize = 64;
/// Without a sidecar, how long the server's process group has between SIGTERM and SIGKILL
/// when the wrapper stops it itself.
pub const KILL_GRACE: Duration = Duration::from_millis(2000);

enum Ev {
    Client(Vec<u8>),
    ClientEof,
    Server {
        generation: u64,
        line: Vec<u8>,
    },
    /// The server closed its stdout.
    ServerEof {
        generation: u64,
    },
    ServerExit {
        generation: u64,
        code: i32,
        how: String,
    },
}

struct InFlight {
    id: Value,
    method: String,
    span: McpSpan,
    progress_token: Option<String>,
    /// The client's batch it came in (a number of this wrapper run), if any: answers in the
    /// server's place go back in one batch per client batch.
    batch: Option<u64>,
}

#[derive(Clone, Debug)]
enum Breaker {
    Closed,
    Open {
        verdict: String,
        reason: String,
        retry_after_ms: u64,
        heard: Instant,
    },
}

struct Server {
    pid: u32,
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    kill: Option<oneshot::Sender<()>>,
}

struct Relay {
    cfg: WrapConfig,
    sidecar: Option<Sidecar>,
    socket: Option<PathBuf>,
    health: Health,
    exporter: Exporter,
    events: mpsc::UnboundedSender<Ev>,
    to_client: mpsc::UnboundedSender<Vec<u8>>,
    server: Option<Server>,
    generation: u64,
    inflight: HashMap<String, InFlight>,
    /// Client batches seen so far (numbers [`InFlight::batch`]).
    batch_seq: u64,
    answered: HashSet<String>,
    pings: VecDeque<(String, Instant)>,
    ping_seq: u64,
    init_request: Option<Value>,
    initialized_note: Option<Vec<u8>>,
    replaying: Option<String>,
    /// When the replayed `initialize` was sent.
    replay_sent: Option<Instant>,
    /// When the current incarnation closed its stdout while still running: it can answer
    /// nothing more, and is stopped once [`WrapConfig::exit_wait`] passes without its exit.
    stdout_closed: Option<Instant>,
    held: VecDeque<Vec<u8>>,
    session_ready: bool,
    slas: HashMap<String, i64>,
    server_name: Option<String>,
    protocol_version: Option<String>,
    session_id: String,
    breaker: Breaker,
    want_admission: watch::Sender<bool>,
    restarts: VecDeque<Instant>,
    exited: Option<(Instant, i32, String)>,
    stopping: bool,
    unregistered: Option<u32>,
}

/// Runs `stallwatch mcp wrap`: relays between this process's stdin/stdout and the server
/// until the client closes stdin (or a SIGTERM / SIGINT / SIGHUP), and answers the exit code
/// to leave with (the server's own, 128 + signal when it was killed).
///
/// Errors: the server cannot be started; it failed more often than the restart policy
/// allows ([`Error::GaveUp`]).
pub async fn wrap(cfg: WrapConfig) -> Result<i32, Error> {
    let data_dir = cfg.data_dir.clone().or_else(sidecar::default_data_dir);
    let sidecar = match &data_dir {
        Some(dir) => match sidecar::discover(dir).await {
            Ok(s) => Some(s),
            Err(why) => {
                eprintln!(
                    "stallwatch mcp: no stallwatch sidecar running ({why}); relaying without supervision"
                );
                None
            }
        },
        None => {
            eprintln!(
                "stallwatch mcp: no data folder (set --data-dir); relaying without supervision"
            );
            None
        }
    };
    let health: Health = std::sync::Arc::new(std::sync::Mutex::new(HealthView {
        last_answer: None,
        ready: false,
        bye: false,
        timeout: cfg.ping_timeout,
        init_sent: None,
        init_timeout: cfg.initialize_timeout,
    }));
    let mut socket = None;
    let mut _socket_task = None;
    let exporter = match &sidecar {
        Some(s) => {
            let path = heartbeat::socket_path(&s.ready.data_dir, &cfg.runner_id);
            match heartbeat::serve(&path, health.clone()) {
                Ok(task) => {
                    _socket_task = Some(task);
                    socket = Some(path);
                }
                Err(e) => eprintln!(
                    "stallwatch mcp: cannot serve the heartbeat socket {}: {e}",
                    path.display()
                ),
            }
            Exporter::start(s.ready.otlp_http_endpoint())
        }
        None => Exporter::disabled(),
    };

    let (events, mut event_rx) = mpsc::unbounded_channel();
    let (to_client, client_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    stallwatch_vocabulary::task::spawn_boxed(read_lines(tokio::io::stdin(), events.clone(), None));
    let client_writer =
        stallwatch_vocabulary::task::spawn_boxed(write_lines(tokio::io::stdout(), client_rx));

    let (news_tx, mut news_rx) = mpsc::unbounded_channel();
    let (want_admission, want_rx) = watch::channel(false);
    if let Some(s) = &sidecar {
        stallwatch_vocabulary::task::spawn_boxed(sidecar::follow_events(
            s.clone(),
            cfg.runner_id.clone(),
            news_tx.clone(),
        ));
        stallwatch_vocabulary::task::spawn_boxed(sidecar::poll_admission(
            s.clone(),
            cfg.runner_id.clone(),
            want_rx,
            news_tx.clone(),
        ));
    }

    let mut relay = Relay {
        session_id: hex::encode(rand::random::<[u8; 16]>()),
        cfg,
        sidecar,
        socket,
        health,
        exporter,
        events,
        to_client,
        server: None,
        generation: 0,
        inflight: HashMap::new(),
        batch_seq: 0,
        answered: HashSet::new(),
        pings: VecDeque::new(),
        ping_seq: 0,
        init_request: None,
        initialized_note: None,
        replaying: None,
        replay_sent: None,
        stdout_closed: None,
        held: VecDeque::new(),
        session_ready: false,
        slas: HashMap::new(),
        server_name: None,
        protocol_version: None,
        breaker: Breaker::Closed,
        want_admission,
        restarts: VecDeque::new(),
        exited: None,
        stopping: false,
        unregistered: None,
    };
    relay.spawn_server(true).await?;

    let mut ping = tokio::time::interval(relay.cfg.ping_interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut signals = Signals::install()?;
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let far = || tokio::time::Instant::now() + Duration::from_secs(86_400);

    let result = loop {
        let explain_at = relay
            .exited
            .as_ref()
            .map(|(t, _, _)| tokio::time::Instant::from_std(*t + EXIT_EXPLAIN_WAIT))
            .unwrap_or_else(far);
        let mute_at = relay
            .stdout_closed
            .map(|t| tokio::time::Instant::from_std(t + relay.cfg.exit_wait))
            .unwrap_or_else(far);
        tokio::select! {
            ev = event_rx.recv() => {
                let Some(ev) = ev else { break Ok(1) };
                match relay.on_event(ev).await {
                    Step::Go => {}
                    Step::StopServer => {
                        stop_deadline = Some(tokio::time::Instant::now() + relay.cfg.exit_wait);
                    }
                    Step::Done(code) => break Ok(code),
                    Step::Fail(e) => break Err(e),
                }
            }
            Some(news) = news_rx.recv() => relay.on_news(news).await,
            _ = ping.tick() => relay.on_ping_tick(),
            _ = tokio::time::sleep_until(explain_at) => {
                if let Err(e) = relay.after_exit().await {
                    break Err(e);
                }
            }
            _ = tokio::time::sleep_until(mute_at) => {
                relay.stdout_closed = None;
                if relay.server.is_some() && !relay.stopping {
                    eprintln!(
                        "stallwatch mcp: the MCP server closed its stdout but still runs; stopping it"
                    );
                    relay.terminate_server().await;
                }
            }
            _ = tokio::time::sleep_until(stop_deadline.unwrap_or_else(far)) => {
                stop_deadline = None;
                relay.terminate_server().await;
            }
            _ = signals.recv() => {
                relay.begin_stop();
                relay.terminate_server().await;
            }
        }
    };
    relay.health_mut(|h| h.bye = true);
    drop(relay.to_client);
    let _ = tokio::time::timeout(Duration::from_secs(2), client_writer).await;
    if let Some(p) = &relay.socket {
        let _ = std::fs::remove_file(p);
    }
    result
}

enum Step {
    Go,
    StopServer,
    Done(i32),
    Fail(Error),
}

impl Relay {
    fn health_mut(&self, f: impl FnOnce(&mut HealthView)) {
        if let Ok(mut h) = self.health.lock() {
            f(&mut h);
        }
    }

    fn resource(&self) -> Resource {
        let name = self.server_name.clone().unwrap_or_else(|| {
            std::path::Path::new(&self.cfg.argv[0])
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| self.cfg.argv[0].clone())
        });
        Resource {
            service_name: format!("mcp:{name}"),
            runner_id: self.cfg.runner_id.clone(),
            pid: self.server.as_ref().map(|s| s.pid),
        }
    }

    fn to_client(&self, line: Vec<u8>) {
        let _ = self.to_client.send(line);
    }

    async fn on_event(&mut self, ev: Ev) -> Step {
        match ev {
            Ev::Client(line) => {
                self.on_client(line).await;
                Step::Go
            }
            Ev::ClientEof => {
                if self.stopping {
                    return Step::Go;
                }
                self.begin_stop();
                match &self.server {
                    None => Step::Done(0),
                    Some(_) => Step::StopServer,
                }
            }
            Ev::Server { generation, line } => {
                if generation == self.generation {
                    self.on_server(line).await;
                }
                Step::Go
            }
            Ev::ServerEof { generation } => {
                if generation == self.generation && self.server.is_some() {
                    self.stdout_closed = Some(Instant::now());
                }
                Step::Go
            }
            Ev::ServerExit {
                generation,
                code,
                how,
            } => {
                if generation != self.generation {
                    return Step::Go;
                }
                self.server = None;
                self.stdout_closed = None;
                self.health_mut(|h| h.ready = false);
                if self.stopping {
                    return Step::Done(code);
                }
                self.exited = Some((Instant::now(), code, how));
                if matches!(self.breaker, Breaker::Open { .. }) {
                    // The trip explains the exit: restart at once.
                    match self.after_exit().await {
                        Ok(()) => Step::Go,
                        Err(e) => Step::Fail(e),
                    }
                } else {
                    Step::Go
                }
            }
        }
    }
}
