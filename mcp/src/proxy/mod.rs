//! The relay: one task owns all state (in-flight requests and their spans, the server
//! process, the breaker as last heard) and reacts to one event at a time; readers and
//! writers of both pipes are separate tasks, so a server that stops reading its stdin never
//! blocks an answer to the client.
//!
//! Lines are relayed byte for byte (MCP spec, Transports: stdio: newline-delimited JSON-RPC
//! messages, no embedded newlines). The wrapper's own messages to the server are `ping`
//! requests with ids `"stallwatch-ping-<n>"` and the replayed `initialize` with id
//! `"stallwatch-init-<generation>"`; their answers are never shown to the client.

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
/// Most outstanding wrapper pings remembered (older ones are forgotten).
const MAX_PINGS: usize = 64;

enum Ev {
    Client(Vec<u8>),
    ClientEof,
    Server {
        generation: u64,
        line: Vec<u8>,
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
    answered: HashSet<String>,
    pings: VecDeque<(String, Instant)>,
    ping_seq: u64,
    init_request: Option<Value>,
    initialized_note: Option<Vec<u8>>,
    replaying: Option<String>,
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
    tokio::spawn(read_lines(tokio::io::stdin(), events.clone(), None));
    let client_writer = tokio::spawn(write_lines(tokio::io::stdout(), client_rx));

    let (news_tx, mut news_rx) = mpsc::unbounded_channel();
    let (want_admission, want_rx) = watch::channel(false);
    if let Some(s) = &sidecar {
        tokio::spawn(sidecar::follow_events(
            s.clone(),
            cfg.runner_id.clone(),
            news_tx.clone(),
        ));
        tokio::spawn(sidecar::poll_admission(
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
        answered: HashSet::new(),
        pings: VecDeque::new(),
        ping_seq: 0,
        init_request: None,
        initialized_note: None,
        replaying: None,
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
    relay.spawn_server(true)?;

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

    /// Starts a new incarnation of the server: own process group, piped stdin/stdout,
    /// stderr passed through; registers it with the sidecar in the background.
    fn spawn_server(&mut self, register_now: bool) -> Result<(), Error> {
        let mut cmd = tokio::process::Command::new(&self.cfg.argv[0]);
        cmd.args(&self.cfg.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // No STALLWATCH_RUNNER_ID here: the reaper hunts processes carrying it as
            // escaped descendants, and would take the next incarnation for one.
            .kill_on_drop(true);
        // Its own process group, so the reaper's group signal (on Windows its CTRL_BREAK
        // to the console group) reaches the server and not the wrapper.
        #[cfg(unix)]
        cmd.process_group(0);
        #[cfg(windows)]
        cmd.creation_flags(windows_sys::Win32::System::Threading::CREATE_NEW_PROCESS_GROUP);
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            program: self.cfg.argv[0].clone(),
            source,
        })?;
        self.generation += 1;
        let generation = self.generation;
        let pid = child.id().unwrap_or(0);
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        if let Some(stdin) = child.stdin.take() {
            tokio::spawn(write_lines(stdin, stdin_rx));
        }
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_lines(stdout, self.events.clone(), Some(generation)));
        }
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let events = self.events.clone();
        tokio::spawn(async move {
            let status = tokio::select! {
                s = child.wait() => s,
                _ = kill_rx => {
                    // Last resort without a sidecar: SIGKILL the direct child (std's own
                    // call); with a sidecar the reaper terminates the whole group.
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            let (code, how) = match status {
                Ok(s) => exit_code_of(s),
                Err(e) => (1, format!("wait failed: {e}")),
            };
            let _ = events.send(Ev::ServerExit {
                generation,
                code,
                how,
            });
        });
        self.server = Some(Server {
            pid,
            stdin: Some(stdin_tx),
            kill: Some(kill_tx),
        });
        self.pings.clear();
        self.health_mut(|h| {
            h.ready = false;
            h.last_answer = None;
        });
        if register_now {
            self.register(pid);
        } else {
            self.unregistered = Some(pid);
        }
        Ok(())
    }

    /// Registers `pid` with the sidecar in the background (no-op without one).
    fn register(&self, pid: u32) {
        if let (Some(s), Some(sock)) = (self.sidecar.clone(), self.socket.clone()) {
            let id = self.cfg.runner_id.clone();
            tokio::spawn(async move {
                if let Err(e) = sidecar::register(&s, &id, pid, &sock).await {
                    eprintln!("stallwatch mcp: cannot register the server (pid {pid}) as runner {id}: {e}");
                }
            });
        }
    }

    fn send_to_server(&mut self, line: Vec<u8>) {
        if self.replaying.is_some() || self.exited.is_some() {
            self.held.push_back(line);
            return;
        }
        if let Some(tx) = self.server.as_ref().and_then(|s| s.stdin.as_ref()) {
            let _ = tx.send(line);
        }
    }

    fn write_server_now(&self, line: Vec<u8>) {
        if let Some(tx) = self.server.as_ref().and_then(|s| s.stdin.as_ref()) {
            let _ = tx.send(line);
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
            Ev::ServerExit {
                generation,
                code,
                how,
            } => {
                if generation != self.generation {
                    return Step::Go;
                }
                self.server = None;
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

    /// The client closed its stdin or the wrapper was told to stop: close the server's
    /// stdin (MCP spec, Lifecycle: Shutdown) and say `BYE` on the heartbeat socket.
    fn begin_stop(&mut self) {
        self.stopping = true;
        self.health_mut(|h| h.bye = true);
        if let Some(s) = self.server.as_mut() {
            s.stdin = None;
        }
    }

    /// Has the server terminated: through the sidecar (`DELETE /api/v1/runners/{id}`:
    /// SIGTERM to its group, grace, SIGKILL), else SIGKILL to the direct child.
    async fn terminate_server(&mut self) {
        let Some(server) = self.server.as_mut() else {
            return;
        };
        if let Some(s) = &self.sidecar {
            if s.client.delete_runner(&self.cfg.runner_id).await.is_ok() {
                return;
            }
        }
        if let Some(k) = server.kill.take() {
            let _ = k.send(());
        }
    }

    /// A server exit that no trip explained within [`EXIT_EXPLAIN_WAIT`] (or that a trip
    /// explains): answer what was in flight, then restart under the policy.
    async fn after_exit(&mut self) -> Result<(), Error> {
        let Some((_, code, how)) = self.exited.take() else {
            return Ok(());
        };
        let (verdict, reason) = match &self.breaker {
            Breaker::Open {
                verdict, reason, ..
            } => (verdict.clone(), reason.clone()),
            Breaker::Closed => (
                "crashed".to_string(),
                format!("the MCP server exited ({how})"),
            ),
        };
        self.fail_inflight(&verdict, &reason, matches!(self.breaker, Breaker::Closed))
            .await;
        let now = Instant::now();
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.cfg.restart_window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= self.cfg.max_restarts {
            eprintln!(
                "stallwatch mcp: the MCP server exited ({how}, code {code}) after {} restarts within {} s; giving up",
                self.restarts.len(),
                self.cfg.restart_window.as_secs()
            );
            return Err(Error::GaveUp {
                restarts: self.restarts.len(),
                window_s: self.cfg.restart_window.as_secs(),
            });
        }
        self.restarts.push_back(now);
        eprintln!("stallwatch mcp: the MCP server exited ({how}); restarting it");
        // A restarted server is registered once it has answered the replayed `initialize`:
        // the sidecar's HALF_OPEN probe then finds it able to answer ping.
        self.spawn_server(self.init_request.is_none())?;
        if let Some(init) = &self.init_request {
            let mut init = init.clone();
            let id = format!("stallwatch-init-{}", self.generation);
            init["id"] = Value::from(id.clone());
            self.replaying = Some(jsonrpc::id_key(&Value::from(id)));
            self.write_server_now(init.to_string().into_bytes());
        } else {
            self.flush_held();
        }
        Ok(())
    }

    fn flush_held(&mut self) {
        while let Some(line) = self.held.pop_front() {
            self.write_server_now(line);
        }
    }

    fn retry_after_ms(&self) -> u64 {
        match &self.breaker {
            Breaker::Open {
                retry_after_ms,
                heard,
                ..
            } => retry_after_ms.saturating_sub(heard.elapsed().as_millis() as u64),
            Breaker::Closed => 0,
        }
    }

    /// Answers every in-flight request with [`TRIPPED_ERROR_CODE`]. Tool spans are ended
    /// here only when `end_tool_spans` (a crash); after a trip stallwatch writes their ends
    /// itself (`error.type = timeout`).
    async fn fail_inflight(&mut self, verdict: &str, reason: &str, end_tool_spans: bool) {
        let retry_after_ms = self.retry_after_ms();
        let message = format!(
            "stallwatch stopped MCP server runner {}: {}",
            self.cfg.runner_id,
            verdict_and_reason(verdict, reason)
        );
        let data = json!({
            "runner_id": self.cfg.runner_id,
            "verdict": verdict,
            "retry_after_ms": retry_after_ms,
        });
        let resource = self.resource();
        let mut drained: Vec<(String, InFlight)> = self.inflight.drain().collect();
        drained.sort_by_key(|(_, f)| f.span.start_unix_nano);
        for (key, mut f) in drained {
            self.to_client(jsonrpc::error_response(
                &f.id,
                TRIPPED_ERROR_CODE,
                &message,
                data.clone(),
            ));
            self.answered.insert(key);
            if f.method != "tools/call" || end_tool_spans {
                let ty = if verdict == "crashed" {
                    "crashed"
                } else {
                    "timeout"
                };
                f.span.end(Some((ty, message.clone())));
                self.exporter.send(&resource, &f.span).await;
            }
        }
    }

    async fn on_client(&mut self, line: Vec<u8>) {
        let Some(msg) = jsonrpc::parse(&line) else {
            self.send_to_server(line);
            return;
        };
        match jsonrpc::kind(&msg) {
            Kind::Request { id, method } => {
                if method == "initialize" {
                    self.init_request = Some(msg.clone());
                }
                let params = msg.get("params");
                let refuse = method == "tools/call"
                    && matches!(self.breaker, Breaker::Open { .. })
                    && !self.admitted_now().await;
                let mut span = self.start_span(&method, params, &msg["id"]);
                if refuse {
                    let Breaker::Open {
                        verdict, reason, ..
                    } = self.breaker.clone()
                    else {
                        return;
                    };
                    let retry_after_ms = self.retry_after_ms();
                    let message = format!(
                        "stallwatch refused the call: the breaker of MCP server runner {} is open ({}); retry after {retry_after_ms} ms",
                        self.cfg.runner_id,
                        verdict_and_reason(&verdict, &reason)
                    );
                    self.to_client(jsonrpc::error_response(
                        &msg["id"],
                        TRIPPED_ERROR_CODE,
                        &message,
                        json!({"runner_id": self.cfg.runner_id, "verdict": verdict, "retry_after_ms": retry_after_ms}),
                    ));
                    span.end(Some(("breaker_open", message)));
                    let r = self.resource();
                    self.exporter.send(&r, &span).await;
                    return;
                }
                if method == "tools/call" {
                    let r = self.resource();
                    self.exporter.send(&r, &span).await;
                }
                let progress_token = params
                    .and_then(|p| p.get("_meta"))
                    .and_then(|m| m.get("progressToken"))
                    .map(jsonrpc::id_key);
                self.answered.remove(&id);
                self.inflight.insert(
                    id,
                    InFlight {
                        id: msg["id"].clone(),
                        method,
                        span,
                        progress_token,
                    },
                );
                self.send_to_server(line);
            }
            Kind::Notification { method } => {
                match method.as_str() {
                    "notifications/initialized" => {
                        self.initialized_note = Some(line.clone());
                        self.send_to_server(line);
                        self.mark_session_ready();
                        return;
                    }
                    "notifications/cancelled" => {
                        let key = msg
                            .get("params")
                            .and_then(|p| p.get("requestId"))
                            .map(jsonrpc::id_key);
                        if let Some(mut f) = key.and_then(|k| self.inflight.remove(&k)) {
                            let why = msg["params"]["reason"]
                                .as_str()
                                .unwrap_or("cancelled by the client")
                                .to_string();
                            f.span.end(Some(("cancelled", why)));
                            let r = self.resource();
                            self.exporter.send(&r, &f.span).await;
                        }
                    }
                    _ => {}
                }
                self.send_to_server(line);
            }
            Kind::Response { .. } | Kind::Other => self.send_to_server(line),
        }
    }

    /// While the breaker was last heard OPEN or HALF_OPEN, asks admission now
    /// (`GET /api/v1/runners/{id}/admit`); true when it says CLOSED (the breaker closed
    /// since). Without an answer within [`ADMIT_DEADLINE`] the call is refused.
    async fn admitted_now(&mut self) -> bool {
        let Some(s) = &self.sidecar else {
            return false;
        };
        let answer =
            tokio::time::timeout(ADMIT_DEADLINE, s.client.admit(&self.cfg.runner_id)).await;
        match answer {
            Ok(Ok(a)) if a.admit => {
                self.on_news(BreakerNews::Closed).await;
                true
            }
            Ok(Ok(a)) => {
                if let Breaker::Open {
                    retry_after_ms,
                    heard,
                    ..
                } = &mut self.breaker
                {
                    *retry_after_ms = a.retry_after_ms.unwrap_or(0);
                    *heard = Instant::now();
                }
                false
            }
            _ => false,
        }
    }

    fn mark_session_ready(&mut self) {
        self.session_ready = true;
        self.health_mut(|h| {
            h.ready = true;
            h.last_answer = Some(Instant::now());
        });
    }

    fn start_span(&self, method: &str, params: Option<&Value>, id: &Value) -> McpSpan {
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        let target = match method {
            "tools/call" | "prompts/get" => name,
            _ => None,
        };
        let mut span = McpSpan::start(method, target, params);
        span.set_str("mcp.method.name", method);
        span.set_str(
            "jsonrpc.request.id",
            match id {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        );
        span.set_str("mcp.session.id", &self.session_id);
        if let Some(v) = &self.protocol_version {
            span.set_str("mcp.protocol.version", v);
        }
        span.set_str("network.transport", "pipe");
        match method {
            "tools/call" => {
                span.set_str("gen_ai.operation.name", "execute_tool");
                if let Some(tool) = name {
                    span.set_str("gen_ai.tool.name", tool);
                    if let Some(sla) = self.slas.get(tool) {
                        span.set_int("stallwatch.sla_ms", *sla);
                    }
                }
            }
            "prompts/get" => {
                if let Some(p) = name {
                    span.set_str("gen_ai.prompt.name", p);
                }
            }
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                if let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
                    span.set_str("mcp.resource.uri", uri);
                }
            }
            _ => {}
        }
        span
    }

    async fn on_server(&mut self, line: Vec<u8>) {
        let Some(msg) = jsonrpc::parse(&line) else {
            self.to_client(line);
            return;
        };
        match jsonrpc::kind(&msg) {
            Kind::Response { id } => {
                if let Some(pos) = self.pings.iter().position(|(k, _)| *k == id) {
                    self.pings.remove(pos);
                    self.health_mut(|h| h.last_answer = Some(Instant::now()));
                    return;
                }
                if self.replaying.as_deref() == Some(id.as_str()) {
                    self.replaying = None;
                    self.read_initialize_result(&msg);
                    if let Some(note) = self.initialized_note.clone() {
                        self.write_server_now(note);
                    }
                    self.mark_session_ready();
                    self.flush_held();
                    if let Some(pid) = self.unregistered.take() {
                        self.register(pid);
                    }
                    return;
                }
                if self.answered.remove(&id) {
                    return;
                }
                if let Some(mut f) = self.inflight.remove(&id) {
                    match f.method.as_str() {
                        "initialize" => self.read_initialize_result(&msg),
                        "tools/list" => self.read_tool_slas(&msg),
                        _ => {
                            if !self.session_ready && self.init_request.is_none() {
                                // A session that started without `initialize`.
                                self.mark_session_ready();
                            }
                        }
                    }
                    let err = if let Some(e) = msg.get("error") {
                        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
                        f.span.set_str("rpc.response.status_code", code.to_string());
                        let m = e
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string();
                        Some((code.to_string(), m))
                    } else if msg["result"]["isError"] == Value::Bool(true) {
                        Some((
                            "tool_error".to_string(),
                            "the tool reported an error".into(),
                        ))
                    } else {
                        None
                    };
                    f.span
                        .end(err.as_ref().map(|(t, m)| (t.as_str(), m.clone())));
                    let r = self.resource();
                    self.exporter.send(&r, &f.span).await;
                }
                self.to_client(line);
            }
            Kind::Notification { method } if method == "notifications/progress" => {
                let token = msg
                    .get("params")
                    .and_then(|p| p.get("progressToken"))
                    .map(jsonrpc::id_key);
                if let Some(t) = token {
                    let span = self
                        .inflight
                        .values()
                        .find(|f| f.progress_token.as_deref() == Some(t.as_str()))
                        .map(|f| f.span.clone());
                    if let Some(span) = span {
                        let r = self.resource();
                        self.exporter.send(&r, &span).await;
                    }
                }
                self.to_client(line);
            }
            _ => self.to_client(line),
        }
    }

    fn read_initialize_result(&mut self, msg: &Value) {
        let result = &msg["result"];
        if let Some(n) = result["serverInfo"]["name"].as_str() {
            self.server_name = Some(n.to_string());
        }
        if let Some(v) = result["protocolVersion"].as_str() {
            self.protocol_version = Some(v.to_string());
        }
    }

    /// Reads `_meta["dev.stallwatch/sla_ms"]` of each tool in a `tools/list` result (a
    /// positive integer, ms); other values are ignored.
    fn read_tool_slas(&mut self, msg: &Value) {
        let Some(tools) = msg["result"]["tools"].as_array() else {
            return;
        };
        for t in tools {
            let (Some(name), Some(sla)) = (
                t["name"].as_str(),
                t["_meta"][SLA_META_KEY].as_i64().filter(|v| *v > 0),
            ) else {
                continue;
            };
            self.slas.insert(name.to_string(), sla);
        }
    }

    fn on_ping_tick(&mut self) {
        if !self.session_ready || self.replaying.is_some() || self.server.is_none() {
            return;
        }
        self.ping_seq += 1;
        let id = format!("stallwatch-ping-{}", self.ping_seq);
        let key = jsonrpc::id_key(&Value::from(id.clone()));
        self.pings.push_back((key, Instant::now()));
        while self.pings.len() > MAX_PINGS {
            self.pings.pop_front();
        }
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string();
        self.write_server_now(line.into_bytes());
    }

    async fn on_news(&mut self, news: BreakerNews) {
        match news {
            BreakerNews::Tripped {
                verdict,
                reason,
                retry_after_ms,
            } => {
                // A `runner.terminated` after the `breaker.opened` keeps the trip's verdict.
                let (verdict, reason) = match &self.breaker {
                    Breaker::Open {
                        verdict, reason, ..
                    } => (verdict.clone(), reason.clone()),
                    Breaker::Closed => (verdict, reason),
                };
                self.breaker = Breaker::Open {
                    verdict: verdict.clone(),
                    reason: reason.clone(),
                    retry_after_ms,
                    heard: Instant::now(),
                };
                let _ = self.want_admission.send(true);
                self.fail_inflight(&verdict, &reason, false).await;
            }
            BreakerNews::Refused {
                state,
                reason,
                retry_after_ms,
            } => {
                let verdict = match &self.breaker {
                    Breaker::Open { verdict, .. } => verdict.clone(),
                    Breaker::Closed => state.to_lowercase(),
                };
                self.breaker = Breaker::Open {
                    verdict,
                    reason,
                    retry_after_ms,
                    heard: Instant::now(),
                };
            }
            BreakerNews::Closed => {
                self.breaker = Breaker::Closed;
                let _ = self.want_admission.send(false);
            }
        }
    }
}

/// `"<verdict>: <reason>"`, without repeating a verdict the reason already starts with.
fn verdict_and_reason(verdict: &str, reason: &str) -> String {
    if reason.starts_with(verdict) {
        reason.to_string()
    } else {
        format!("{verdict}: {reason}")
    }
}

/// Reads newline-delimited lines (without the `\n`) and sends them as events; EOF on the
/// client side is [`Ev::ClientEof`].
async fn read_lines<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    events: mpsc::UnboundedSender<Ev>,
    generation: Option<u64>,
) {
    let mut r = BufReader::with_capacity(64 * 1024, r);
    loop {
        let mut line = Vec::new();
        match r.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                if line.is_empty() {
                    continue;
                }
                let ev = match generation {
                    Some(generation) => Ev::Server { generation, line },
                    None => Ev::Client(line),
                };
                if events.send(ev).is_err() {
                    return;
                }
            }
        }
    }
    if generation.is_none() {
        let _ = events.send(Ev::ClientEof);
    }
}

/// Writes each line plus `\n`, flushing when the queue is momentarily empty.
async fn write_lines<W: tokio::io::AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut w = tokio::io::BufWriter::new(w);
    while let Some(line) = rx.recv().await {
        if w.write_all(&line).await.is_err() || w.write_all(b"\n").await.is_err() {
            return;
        }
        if rx.is_empty() && w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.flush().await;
}

/// The wrapper's own exit code for the server's status, and how it ended: the server's
/// code, or `128 + signal` for a signalled server (the shell convention).
#[cfg(unix)]
fn exit_code_of(s: std::process::ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => (c, format!("exit status {c}")),
        (None, Some(sig)) => (128 + sig, format!("killed by signal {sig}")),
        _ => (1, "unknown exit".to_string()),
    }
}

/// The wrapper's own exit code for the server's status: Windows always has an exit code.
#[cfg(windows)]
fn exit_code_of(s: std::process::ExitStatus) -> (i32, String) {
    match s.code() {
        Some(c) => (c, format!("exit status {c}")),
        None => (1, "unknown exit".to_string()),
    }
}

/// Ctrl-C, Ctrl-Break and console close on Windows: the wrapper's stop requests there.
#[cfg(windows)]
struct Signals {
    c: tokio::signal::windows::CtrlC,
    brk: tokio::signal::windows::CtrlBreak,
    close: tokio::signal::windows::CtrlClose,
}

#[cfg(windows)]
impl Signals {
    fn install() -> Result<Self, Error> {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
        let io = |source| Error::Io {
            what: "cannot watch console control events".into(),
            source,
        };
        Ok(Self {
            c: ctrl_c().map_err(io)?,
            brk: ctrl_break().map_err(io)?,
            close: ctrl_close().map_err(io)?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.c.recv() => {}
            _ = self.brk.recv() => {}
            _ = self.close.recv() => {}
        }
    }
}

#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let io = |source| Error::Io {
            what: "cannot watch stop signals".into(),
            source,
        };
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(io)?,
            int: signal(SignalKind::interrupt()).map_err(io)?,
            hup: signal(SignalKind::hangup()).map_err(io)?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}
