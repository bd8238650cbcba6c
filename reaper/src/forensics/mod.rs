//! Stall forensics: on a trip, before the first SIGTERM, stallwatch records *why* the runner
//! was stuck, within a bounded time budget (`[reaper] forensics_budget_ms`, default 500;
//! 0 turns it off and leaves the trip path exactly as without it). Issue 18; `docs/design.md`,
//! section "Stall forensics".
//!
//! Two sources:
//! - the kernel, for any runner ([`procfs`]): per thread its state, `wchan`, current system
//!   call and CPU, per process RSS and open fds, plus the CPU history a timer samples
//!   ([`cpu`]) so "0% CPU for 58 s" and "100% CPU for 30 s" can be said at trip time;
//!   [`classify`](mod@classify) turns that into one plain sentence;
//! - the runner's kit, when present ([`stacks`]): stallwatch gives spawned runners
//!   `STALLWATCH_STACKS_FILE`; a kit writes a header line there and dumps its stacks on
//!   SIGUSR2 (Python `faulthandler`, Node `process.report`). SIGUSR2 is sent only through a
//!   pidfd and only when the header names the runner's pid. A Node kit whose header offers
//!   `main_stack=heartbeat` is asked `STACKS` on its heartbeat socket instead and gets no
//!   signal (SIGUSR2 only when that answer is an error): its answer names a busy loop's
//!   line and a stuck tool's await site, which the signal's report cannot, and no signal
//!   can land in the window at exit where Node has already given SIGUSR2 back to its
//!   default action (ending the process).
//!
//! The evidence (`classification`, `threads`, `stacks`, `forensics`; at most
//! [`MAX_EVIDENCE_BYTES`]) goes into the `runner.terminated` incident and, as a follow-up
//! update, into the incident that caused it (the trip's `breaker.opened`). `verdict.suspect`
//! incidents get the same evidence as a follow-up update, without any kill: the forensics
//! task follows the event bus (the watchdog never calls the reaper).

pub mod classify;
pub mod cpu;
pub mod procfs;
pub mod stacks;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use stallwatch_storage::control::Trip;
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::Storage;

use self::classify::{classify, CpuFacts};
use self::cpu::{History, Sample};
use self::procfs::ProcessSnapshot;
use self::stacks::{Frame, Runtime, ThreadStack};

pub use crate::config::{
    FORENSICS_DEFAULT_BUDGET as DEFAULT_BUDGET,
    FORENSICS_DEFAULT_SAMPLE_INTERVAL as DEFAULT_SAMPLE_INTERVAL,
};
/// Largest evidence stored with an incident, bytes of JSON (64 KiB, issue 18).
pub const MAX_EVIDENCE_BYTES: usize = 64 * 1024;
/// The "last seconds" window of the recent-CPU figure: five sampling intervals, at least
/// this long ...
pub const RECENT_WINDOW_MIN: Duration = Duration::from_secs(1);
/// ... and at most this long.
pub const RECENT_WINDOW_MAX: Duration = Duration::from_secs(10);
/// Time kept at the end of the budget for turning what was read into evidence.
const ASSEMBLY_RESERVE: Duration = Duration::from_millis(10);
/// Time kept between the dump's own deadline and its backstop timeout.
const DUMP_SLACK: Duration = Duration::from_millis(4);
/// How often the dump file is polled while the kit writes it.
const POLL: Duration = Duration::from_millis(5);
/// At most one suspect collection per runner in this time.
const SUSPECT_MIN_GAP: Duration = Duration::from_secs(10);
/// Name of the environment variable carrying the stacks file path.
pub const STACKS_FILE_ENV: &str = "STALLWATCH_STACKS_FILE";

/// The stacks file of one spawned runner instance: `<data_dir>/run/<id>.<instance>.stacks`.
pub fn stacks_path(data_dir: &Path, runner_id: &str, instance_id: &str) -> PathBuf {
    data_dir
        .join("run")
        .join(format!("{runner_id}.{instance_id}.stacks"))
}

/// The runner forensics looks at.
#[derive(Debug)]
pub struct Subject {
    /// Runner id.
    pub runner_id: String,
    /// Its instance id (one per spawn).
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
    /// Its pidfd (identity proof); `None`: no dump signal is sent.
    pub pidfd: Option<OwnedFd>,
    /// Spawned by stallwatch (it has a stacks file).
    pub spawned: bool,
    /// Its argv (the scripts named there are "the tool's own files").
    pub argv: Vec<String>,
    /// Its heartbeat socket (asked `STACKS` when the kit's header offers `main_stack=heartbeat`).
    pub heartbeat_socket: Option<PathBuf>,
}

/// The tool span a trip or suspect is about.
#[derive(Clone, Debug, Default)]
pub struct ToolContext {
    /// `gen_ai.tool.name` (or span name).
    pub tool_name: Option<String>,
    /// The span's start, ns since the Unix epoch.
    pub span_start_unix_nano: Option<u64>,
}

/// Evidence ready to store: the keys added to an incident's evidence and the reason line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// `classification`, `threads`, `stacks`, `forensics`.
    pub fields: Map<String, Value>,
    /// "classification; main thread at frame".
    pub reason_line: String,
}

/// Forensics state of one reaper: CPU histories and evidence waiting for its incident.
pub struct Forensics {
    budget: Duration,
    sample_every: Duration,
    data_dir: PathBuf,
    hz: u64,
    histories: Mutex<HashMap<(u32, String), History>>,
    pending: Mutex<HashMap<String, Evidence>>,
    last_suspect: Mutex<HashMap<String, Instant>>,
}

impl Forensics {
    /// From the reaper's config.
    pub fn new(config: &crate::config::ReaperConfig) -> Self {
        Self {
            budget: config.forensics_budget,
            sample_every: config.forensics_sample,
            data_dir: config.data_dir.clone(),
            hz: procfs::ticks_per_second(),
            histories: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            last_suspect: Mutex::new(HashMap::new()),
        }
    }

    /// False when `forensics_budget_ms = 0`.
    pub fn enabled(&self) -> bool {
        !self.budget.is_zero()
    }

    /// Takes one CPU sample of each `(pid, instance_id)` and forgets processes not listed.
    pub fn sample(&self, runners: &[(u32, String)]) {
        let now = Instant::now();
        let at_unix_nano = now_unix_nano();
        let samples: Vec<((u32, String), Sample)> = runners
            .iter()
            .filter_map(|(pid, inst)| {
                let (total, demand_ns, per, per_demand) = procfs::read_cpu(*pid)?;
                Some((
                    (*pid, inst.clone()),
                    Sample {
                        at: now,
                        at_unix_nano,
                        total_ticks: total,
                        demand_ns,
                        per_thread: per,
                        per_thread_demand: per_demand,
                    },
                ))
            })
            .collect();
        if let Ok(mut h) = self.histories.lock() {
            h.retain(|k, _| runners.iter().any(|(p, i)| (*p, i) == (k.0, &k.1)));
            for (k, s) in samples {
                h.entry(k).or_default().push(s);
            }
        }
    }

    /// Removes stacks files of runner instances no longer registered.
    pub fn clean_stacks_files(&self, current: &[(String, String)]) {
        let Ok(dir) = std::fs::read_dir(self.data_dir.join("run")) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // `<id>.<instance>.stacks` and files a kit names after it (`....stacks.report.json`).
            let Some(stem) = name.find(".stacks").map(|i| &name[..i]) else {
                continue;
            };
            if !current
                .iter()
                .any(|(id, inst)| stem == format!("{id}.{inst}"))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Leaves `evidence` for the next `runner.terminated` of `runner_id`.
    pub fn stash(&self, runner_id: &str, evidence: Evidence) {
        if let Ok(mut p) = self.pending.lock() {
            p.insert(runner_id.to_string(), evidence);
        }
    }

    /// Takes the evidence left for `runner_id`, if any.
    pub fn take(&self, runner_id: &str) -> Option<Evidence> {
        self.pending.lock().ok()?.remove(runner_id)
    }

    /// The trip hook, called right before the first SIGTERM: collects evidence about
    /// `subject` until at most the budget past the trip's decision time, then stashes it
    /// for the `runner.terminated` incident and adds it to the trip's incident in the
    /// background. Does nothing when forensics is off.
    pub async fn before_kill(&self, storage: &Storage, trip: &Trip, subject: Subject) {
        if !self.enabled() {
            return;
        }
        let lag = Duration::from_nanos(now_unix_nano().saturating_sub(trip.at_unix_nano));
        let left = self.budget.saturating_sub(lag);
        let deadline = tokio::time::Instant::now() + left;
        let tool = async {
            match trip.incident_id {
                Some(id) => tool_context(storage, id).await,
                None => ToolContext::default(),
            }
        };
        let mut evidence = self.collect(&subject, tool, deadline).await;
        // How long after the trip's decision forensics handed over to the kill.
        let done = now_unix_nano().saturating_sub(trip.at_unix_nano) / 1_000_000;
        if let Some(f) = evidence.fields.get_mut("forensics") {
            f["done_after_trip_ms"] = done.into();
        }
        if let Some(id) = trip.incident_id {
            let storage = storage.clone();
            let ev = evidence.clone();
            tokio::spawn(async move { attach(&storage, id, &ev).await });
        }
        self.stash(&subject.runner_id, evidence);
    }

    /// The suspect hook: collects evidence for a `verdict.suspect` incident (no kill) and
    /// adds it to that incident. At most one per runner per 10 s.
    pub async fn on_suspect(&self, storage: &Storage, incident_id: i64, subject: Subject) {
        if !self.enabled() {
            return;
        }
        let now = Instant::now();
        if let Ok(mut last) = self.last_suspect.lock() {
            if last
                .get(&subject.runner_id)
                .is_some_and(|t| now.saturating_duration_since(*t) < SUSPECT_MIN_GAP)
            {
                return;
            }
            last.insert(subject.runner_id.clone(), now);
        }
        let deadline = tokio::time::Instant::now() + self.budget;
        let tool = tool_context(storage, incident_id);
        let evidence = self.collect(&subject, tool, deadline).await;
        attach(storage, incident_id, &evidence).await;
    }

    /// Collects evidence about `s` until `deadline` at the latest. `tool` (the span lookup)
    /// runs alongside the kernel read and the dump.
    pub async fn collect(
        &self,
        s: &Subject,
        tool: impl std::future::Future<Output = ToolContext>,
        deadline: tokio::time::Instant,
    ) -> Evidence {
        let started = Instant::now();
        let pid = s.pid;
        let kernel = async {
            match tokio::time::timeout_at(
                deadline,
                tokio::task::spawn_blocking(move || {
                    let p = procfs::read_process(pid)?;
                    Some((p, Instant::now(), now_unix_nano()))
                }),
            )
            .await
            {
                Ok(Ok(p)) => p,
                _ => None,
            }
        };
        let (tool, snap) = tokio::join!(
            async {
                tokio::time::timeout_at(deadline, tool)
                    .await
                    .unwrap_or_default()
            },
            kernel
        );
        let stopped = snap
            .as_ref()
            .is_some_and(|(p, _, _)| matches!(p.state, 'T' | 't' | 'Z' | 'X'));
        let stacks = if snap.is_none() {
            Err("the runner is gone".to_string())
        } else if stopped {
            Err(
                "the runner is stopped: a dump signal would only be handled once it runs again"
                    .into(),
            )
        } else {
            let dump_deadline = deadline
                .checked_sub(ASSEMBLY_RESERVE)
                .unwrap_or(deadline)
                .max(tokio::time::Instant::now());
            // The dump returns what it has a little before its deadline (a Node kit's
            // STACKS answer without the report); the timeout is the backstop.
            let inner = dump_deadline
                .checked_sub(DUMP_SLACK)
                .unwrap_or(dump_deadline)
                .max(tokio::time::Instant::now());
            tokio::time::timeout_at(dump_deadline, self.dump(s, inner))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "no complete dump within the {} ms budget",
                        self.budget.as_millis()
                    ))
                })
        };
        self.assemble(s, &tool, snap, stacks, started)
    }

    /// Takes the kit's stacks: from a Node kit that offers `main_stack=heartbeat`, by asking
    /// `STACKS` on its heartbeat socket (no signal at all); else (or when that answer is an
    /// error) by SIGUSR2, sent only when the header names the pid, then waits for the dump.
    async fn dump(&self, s: &Subject, deadline: tokio::time::Instant) -> Result<Dump, String> {
        if !s.spawned {
            return Err(format!(
                "attached runner: stallwatch gave it no {STACKS_FILE_ENV}, so no dump was asked for"
            ));
        }
        let file = stacks_path(&self.data_dir, &s.runner_id, &s.instance_id);
        let header = stacks::read_header(&file, s.pid)?;
        let mut heartbeat_note = None;
        if let (Runtime::Node, true, Some(sock)) =
            (header.runtime, header.main_stack, &s.heartbeat_socket)
        {
            match tokio::time::timeout_at(deadline, ask_stacks(sock)).await {
                Ok(Ok(hb)) => return Ok(node_dump(hb, &file)),
                Ok(Err(why)) => heartbeat_note = Some(why),
                Err(_) => {
                    return Err(format!(
                        "the node kit did not answer STACKS on its heartbeat socket within the {} ms budget",
                        self.budget.as_millis()
                    ))
                }
            }
        }
        let Some(fd) = &s.pidfd else {
            return Err("the runner's identity is not pinned by a pidfd: no signal sent".into());
        };
        let report = header.report.clone();
        let before = match header.runtime {
            Runtime::Python => file_meta(&file),
            Runtime::Node => report.as_deref().and_then(file_meta),
        };
        crate::platform::send_dump_signal(crate::platform::borrow(fd), s.pid)
            .map_err(|e| format!("SIGUSR2 not sent: {e}"))?;
        let mut last_len = None;
        loop {
            if tokio::time::Instant::now() + POLL > deadline {
                let why = heartbeat_note.map_or(String::new(), |w| format!("; {w}"));
                return Err(format!(
                    "the {} kit wrote no complete dump within the {} ms budget{}{why}",
                    runtime_name(header.runtime),
                    self.budget.as_millis(),
                    if header.runtime == Runtime::Node {
                        " (Node writes its report only when the event loop is free)"
                    } else {
                        ""
                    },
                ));
            }
            tokio::time::sleep_until((tokio::time::Instant::now() + POLL).min(deadline)).await;
            match header.runtime {
                Runtime::Python => {
                    let now = file_meta(&file);
                    let grew = now.map(|m| m.0) > before.map(|m| m.0);
                    if grew && now.map(|m| m.0) == last_len {
                        let from = before.map_or(0, |m| m.0);
                        let text = read_range(&file, from)?;
                        let threads = stacks::parse_faulthandler(&text);
                        if !threads.is_empty() {
                            return Ok(Dump {
                                runtime: Runtime::Python,
                                threads,
                                active_handles: Vec::new(),
                                source: file,
                                heartbeat_note: None,
                            });
                        }
                    }
                    last_len = now.map(|m| m.0);
                }
                Runtime::Node => {
                    let Some(path) = report.as_deref() else {
                        return Err("no report path".into());
                    };
                    let now = file_meta(path);
                    if now.is_some() && now != before {
                        if let Ok(text) = read_range(path, 0) {
                            if let Ok(r) = stacks::parse_node_report(&text) {
                                return Ok(Dump {
                                    runtime: Runtime::Node,
                                    threads: r.threads,
                                    active_handles: r.active_handles,
                                    source: path.to_path_buf(),
                                    heartbeat_note,
                                });
                            }
                        }
                    }
                }
            }
        }
    }

    fn assemble(
        &self,
        s: &Subject,
        tool: &ToolContext,
        snap: Option<(ProcessSnapshot, Instant, u64)>,
        stacks: Result<Dump, String>,
        started: Instant,
    ) -> Evidence {
        let Some((snap, read_at, read_at_unix_nano)) = snap else {
            let mut fields = Map::new();
            fields.insert(
                "classification".into(),
                "the runner was gone before it could be examined".into(),
            );
            fields.insert("threads".into(), json!([]));
            fields.insert(
                "stacks".into(),
                json!({"unavailable": stacks.err().unwrap_or_default()}),
            );
            fields.insert("forensics".into(), json!({"kind": "gone", "pid": s.pid, "budget_ms": self.budget.as_millis() as u64, "collected_ms": started.elapsed().as_millis() as u64}));
            return Evidence {
                fields,
                reason_line: "forensics: the runner was gone before it could be examined".into(),
            };
        };
        let sample = Sample {
            at: read_at,
            at_unix_nano: read_at_unix_nano,
            total_ticks: snap.cpu_ticks(),
            demand_ns: snap.demand_ns(),
            per_thread: snap
                .threads
                .iter()
                .map(|t| (t.tid, t.cpu_ticks()))
                .collect(),
            per_thread_demand: snap
                .threads
                .iter()
                .filter_map(|t| Some((t.tid, t.demand_ns?)))
                .collect(),
        };
        let hist = self
            .histories
            .lock()
            .ok()
            .and_then(|h| h.get(&(s.pid, s.instance_id.clone())).cloned())
            .unwrap_or_default();
        let window = (self.sample_every * 5).clamp(RECENT_WINDOW_MIN, RECENT_WINDOW_MAX);
        let recent = hist.use_recent(window, &sample, self.hz);
        let since_start = tool
            .span_start_unix_nano
            .and_then(|t| hist.use_since(t, &sample, self.hz));
        let busy_for = hist.busy_for(&sample, self.hz, classify::BUSY_PCT);
        let idle = hist.idle_per_thread(&sample);
        let busiest = snap.threads.iter().max_by_key(|t| t.cpu_ticks());
        let user_share_pct = busiest
            .filter(|t| t.cpu_ticks() > 0)
            .map_or(100, |t| (t.utime_ticks * 100 / t.cpu_ticks()) as u32);
        let facts = CpuFacts {
            recent_pct: recent.map(|u| u.pct),
            recent_demand_pct: recent.and_then(|u| u.demand_pct),
            busy_for,
            user_share_pct,
        };
        let class = classify(&snap, facts, &idle);
        let ms = |ticks: u64| ticks * 1000 / self.hz;
        let threads: Vec<Value> = snap
            .threads
            .iter()
            .map(|t| {
                json!({
                    "tid": t.tid, "name": t.name, "main": t.main,
                    "state": t.state.to_string(), "state_name": classify::state_name(t.state),
                    "wchan": t.wchan, "syscall": t.syscall, "syscall_target": t.syscall_fd_target,
                    "futex_untimed": t.futex_untimed,
                    "idle_ms": idle.get(&t.tid).map(|d| d.as_millis() as u64),
                    "cpu_user_ms": ms(t.utime_ticks), "cpu_system_ms": ms(t.stime_ticks),
                    "voluntary_ctxt_switches": t.voluntary_ctxt_switches,
                    "nonvoluntary_ctxt_switches": t.nonvoluntary_ctxt_switches,
                })
            })
            .collect();
        let tool_files: Vec<String> = s
            .argv
            .iter()
            .filter(|a| {
                [".py", ".js", ".mjs", ".cjs", ".ts"]
                    .iter()
                    .any(|e| a.ends_with(e))
            })
            .cloned()
            .collect();
        let (stacks_json, top) = match stacks {
            Ok(mut d) => {
                let tool_frame = stacks::mark_tool_frames(
                    &mut d.threads,
                    tool.tool_name.as_deref(),
                    &tool_files,
                );
                let main_top = d
                    .threads
                    .iter()
                    .find(|t| t.main)
                    .and_then(|t| t.frames.first().cloned());
                let idle = d.runtime == Runtime::Node
                    && d.threads
                        .iter()
                        .filter(|t| t.main)
                        .all(|t| t.frames.is_empty());
                let awaiting = d
                    .threads
                    .iter()
                    .any(|t| t.label.is_some() && !t.frames.is_empty());
                let note = match (idle, awaiting) {
                    (true, true) => Some("no JavaScript was running: the event loop was idle; the tool span is waiting at its await site (below), on a promise or I/O that never completes"),
                    (true, false) => Some("no JavaScript was running: the event loop was idle, waiting on a promise or I/O that never completes"),
                    _ => None,
                };
                let v = json!({
                    "runtime": d.runtime, "source": d.source, "threads": d.threads,
                    "tool_frame": tool_frame, "active_handles": d.active_handles.iter().map(|(t, n)| json!({"type": t, "count": n})).collect::<Vec<_>>(),
                    "note": note, "main_stack_unavailable": d.heartbeat_note,
                });
                (v, Some((main_top, tool_frame)))
            }
            Err(why) => (json!({ "unavailable": why }), None),
        };
        let mut reason_line = class.summary.clone();
        if let Some((main_top, tool_frame)) = &top {
            if let Some(f) = main_top {
                reason_line.push_str(&format!("; main thread at {}", stacks::describe_frame(f)));
            }
            if let Some(t) = tool_frame
                .as_ref()
                .filter(|t| Some(*t) != main_top.as_ref())
            {
                reason_line.push_str(&format!(" (tool code: {})", stacks::describe_frame(t)));
            }
        }
        let forensics = json!({
            "kind": class.kind, "pid": s.pid, "thread_count": snap.thread_count,
            "rss_bytes": snap.rss_bytes, "fd_count": snap.fd_count,
            "tool_name": tool.tool_name,
            "cpu": {
                "recent_pct": recent.map(|u| u.pct), "recent_window_ms": recent.map(|u| u.window_ms),
                "recent_demand_pct": recent.and_then(|u| u.demand_pct),
                "since_span_start_pct": since_start.map(|u| u.pct),
                "since_span_start_window_ms": since_start.map(|u| u.window_ms),
                "busy_for_ms": busy_for.as_millis() as u64, "user_share_pct": user_share_pct,
                "samples": hist.len(),
            },
            "budget_ms": self.budget.as_millis() as u64,
            "collected_ms": started.elapsed().as_millis() as u64,
            "truncated": false,
        });
        let mut fields = Map::new();
        fields.insert("classification".into(), Value::String(class.summary));
        fields.insert("threads".into(), Value::Array(threads));
        fields.insert("stacks".into(), stacks_json);
        fields.insert("forensics".into(), forensics);
        bound(&mut fields, MAX_EVIDENCE_BYTES);
        Evidence {
            fields,
            reason_line,
        }
    }
}

/// A parsed dump.
struct Dump {
    runtime: Runtime,
    threads: Vec<ThreadStack>,
    active_handles: Vec<(String, usize)>,
    source: PathBuf,
    /// Why the Node kit's `STACKS` answer is missing, when it is.
    heartbeat_note: Option<String>,
}

fn runtime_name(r: Runtime) -> &'static str {
    match r {
        Runtime::Python => "python",
        Runtime::Node => "node",
    }
}

/// A Node dump from the kit's `STACKS` answer: the main thread's stack, one labelled stack
/// per open tool span's await site, and (free event loop) the loop's handles.
fn node_dump(hb: stacks::HeartbeatStacks, stacks_file: &Path) -> Dump {
    let mut threads = vec![hb.main];
    threads.extend(hb.tools);
    Dump {
        runtime: Runtime::Node,
        threads,
        active_handles: hb.active_handles,
        source: stacks_file.to_path_buf(),
        heartbeat_note: None,
    }
}

/// Asks the Node kit `STACKS` on its heartbeat socket; reads one answer line (bounded).
/// The caller bounds the time.
async fn ask_stacks(sock: &Path) -> Result<stacks::HeartbeatStacks, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::UnixStream::connect(sock)
        .await
        .map_err(|e| format!("the heartbeat socket cannot be reached for STACKS: {e}"))?;
    c.write_all(b"STACKS\n")
        .await
        .map_err(|e| format!("STACKS not sent: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while buf.len() < stacks::MAX_HEARTBEAT_ANSWER_BYTES && !buf.contains(&b'\n') {
        let n = c
            .read(&mut chunk)
            .await
            .map_err(|e| format!("the STACKS answer cannot be read: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    stacks::parse_heartbeat_stacks(&String::from_utf8_lossy(&buf))
}

fn file_meta(p: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?))
}

fn read_range(p: &Path, from: u64) -> Result<String, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(p).map_err(|e| format!("dump unreadable: {e}"))?;
    f.seek(SeekFrom::Start(from))
        .map_err(|e| format!("dump unreadable: {e}"))?;
    let mut buf = Vec::new();
    f.take(stacks::MAX_DUMP_BYTES)
        .read_to_end(&mut buf)
        .map_err(|e| format!("dump unreadable: {e}"))?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The tool name and span start of the incident `id` (trip or suspect).
async fn tool_context(storage: &Storage, id: i64) -> ToolContext {
    let Ok(Some(inc)) = storage.incident(id).await else {
        return ToolContext::default();
    };
    let n = inc.incident;
    let mut ctx = ToolContext {
        tool_name: n.tool_name.clone(),
        span_start_unix_nano: None,
    };
    if let (Some(t), Some(s)) = (n.trace_id, n.span_id) {
        if let Ok(Some(span)) = storage.span(t, s).await {
            ctx.span_start_unix_nano = Some(span.span.start_time_unix_nano);
            if ctx.tool_name.is_none() {
                ctx.tool_name = Some(span.span.name.clone());
            }
        }
    }
    ctx
}

/// Adds `ev` to incident `id` (the follow-up update).
async fn attach(storage: &Storage, id: i64, ev: &Evidence) {
    if let Err(e) = storage
        .attach_incident_evidence(id, ev.fields.clone(), Some(ev.reason_line.clone()))
        .await
    {
        tracing::warn!(incident = id, "forensics not added to the incident: {e}");
    }
}

/// Shrinks `fields` to at most `max` bytes of JSON: fewer frames per thread, then fewer
/// threads, then no stacks. Sets `forensics.truncated`.
pub fn bound(fields: &mut Map<String, Value>, max: usize) {
    let size = |f: &Map<String, Value>| serde_json::to_vec(f).map_or(usize::MAX, |v| v.len());
    if size(fields) <= max {
        return;
    }
    if let Some(f) = fields.get_mut("forensics") {
        f["truncated"] = Value::Bool(true);
    }
    for keep in [16usize, 4, 1] {
        if let Some(threads) = fields
            .get_mut("stacks")
            .and_then(|s| s.get_mut("threads"))
            .and_then(Value::as_array_mut)
        {
            for t in threads.iter_mut() {
                if let Some(frames) = t.get_mut("frames").and_then(Value::as_array_mut) {
                    if frames.len() > keep {
                        let cut = frames.len() - keep;
                        frames.truncate(keep);
                        let omitted = t["frames_omitted"].as_u64().unwrap_or(0) + cut as u64;
                        t["frames_omitted"] = omitted.into();
                    }
                }
            }
        }
        if size(fields) <= max {
            return;
        }
    }
    for key in ["threads"] {
        if let Some(a) = fields.get_mut(key).and_then(Value::as_array_mut) {
            a.truncate(32);
        }
    }
    if let Some(a) = fields
        .get_mut("stacks")
        .and_then(|s| s.get_mut("threads"))
        .and_then(Value::as_array_mut)
    {
        a.truncate(32);
    }
    if size(fields) <= max {
        return;
    }
    fields.insert(
        "stacks".into(),
        json!({"unavailable": format!("the stacks were over the {max}-byte evidence limit")}),
    );
    if let Some(a) = fields.get_mut("threads").and_then(Value::as_array_mut) {
        a.truncate(8);
    }
}

/// The runner id of a `verdict.suspect` incident, when it is one.
pub fn suspect_runner(kind: EventKind, runner_id: Option<&str>) -> Option<&str> {
    (kind == EventKind::VerdictSuspect)
        .then_some(runner_id)
        .flatten()
}

/// Starts the forensics task of a reaper: the CPU sampler (every `forensics_sample_ms`),
/// stacks-file cleanup, and evidence for `verdict.suspect` incidents from the event bus.
/// Does nothing when forensics is off.
pub fn start(reaper: crate::ReaperHandle) {
    let fx = reaper.forensics();
    if !fx.enabled() {
        return;
    }
    let every = fx.sample_every;
    let mut events = reaper.events().subscribe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = reaper.shutdown_token().cancelled() => break,
                _ = tick.tick() => {
                    let runners = reaper.forensics_runners();
                    let pids: Vec<(u32, String)> = runners.iter().map(|r| (r.1, r.2.clone())).collect();
                    let fx2 = reaper.forensics();
                    let _ = tokio::task::spawn_blocking(move || fx2.sample(&pids)).await;
                    ticks += 1;
                    if ticks % 32 == 1 {
                        let current: Vec<(String, String)> = runners.into_iter().map(|r| (r.0, r.2)).collect();
                        reaper.forensics().clean_stacks_files(&current);
                    }
                }
                ev = events.recv() => match ev {
                    Ok(inc) => {
                        let Some(id) = suspect_runner(inc.incident.kind, inc.incident.runner_id.as_deref()) else { continue };
                        if inc.id <= 0 { continue; }
                        if let Some(subject) = reaper.forensics_subject(id).await {
                            let r = reaper.clone();
                            let inc_id = inc.id;
                            tokio::spawn(async move {
                                r.forensics().on_suspect(r.storage(), inc_id, subject).await;
                            });
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                },
            }
        }
    });
}

/// The frame summary used in webhooks and reasons (for other crates' tests).
pub fn frame_summary(f: &Frame) -> String {
    stacks::describe_frame(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_is_bounded() {
        let frames: Vec<Value> = (0..48)
            .map(|i| json!({"function": format!("f{i}"), "file": "x".repeat(200), "line": i}))
            .collect();
        let threads: Vec<Value> = (0..64)
            .map(|i| json!({"id": i, "frames": frames.clone()}))
            .collect();
        let mut f = Map::new();
        f.insert("classification".into(), "x".into());
        f.insert(
            "threads".into(),
            json!((0..256)
                .map(|i| json!({"tid": i, "name": "n".repeat(15)}))
                .collect::<Vec<_>>()),
        );
        f.insert(
            "stacks".into(),
            json!({"runtime": "python", "threads": threads}),
        );
        f.insert("forensics".into(), json!({"truncated": false}));
        bound(&mut f, MAX_EVIDENCE_BYTES);
        let n = serde_json::to_vec(&f).unwrap().len();
        assert!(n <= MAX_EVIDENCE_BYTES, "{n}");
        assert_eq!(f["forensics"]["truncated"], true);
        assert_eq!(f["classification"], "x");
        // Small evidence is left alone.
        let mut small = Map::new();
        small.insert("forensics".into(), json!({"truncated": false}));
        bound(&mut small, MAX_EVIDENCE_BYTES);
        assert_eq!(small["forensics"]["truncated"], false);
    }

    #[test]
    fn stacks_files_are_per_instance() {
        let p = stacks_path(Path::new("/d"), "r1", "u-1");
        assert_eq!(p, PathBuf::from("/d/run/r1.u-1.stacks"));
    }
}
