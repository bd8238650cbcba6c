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
mod dump;
mod evidence;
pub mod procfs;
mod sampler;
pub mod stacks;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use stallwatch_storage::control::{RunnerBoard, Trip};
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::Storage;
use tokio::sync::watch;

use self::classify::{classify, CpuFacts};
use self::cpu::{History, Sample};
use self::evidence::{attach, tool_context};
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
    /// The watchdog's board, once wired ([`Forensics::follow_board`]): the sampler reads
    /// only the runners it names as needing it.
    board: OnceLock<watch::Receiver<RunnerBoard>>,
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
            board: OnceLock::new(),
        }
    }

    /// False when `forensics_budget_ms = 0`.
    pub fn enabled(&self) -> bool {
        !self.budget.is_zero()
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
            stallwatch_vocabulary::task::spawn_boxed(
                async move { attach(&storage, id, &ev).await },
            );
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
                    let p = procfs::read_settled(pid)?;
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
}

pub use self::evidence::bound;
pub use self::sampler::{start, suspect_runner};

/// The frame summary used in webhooks and reasons (for other crates' tests).
pub fn frame_summary(f: &Frame) -> String {
    stacks::describe_frame(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_files_are_per_instance() {
        let p = stacks_path(Path::new("/d"), "r1", "u-1");
        assert_eq!(p, PathBuf::from("/d/run/r1.u-1.stacks"));
    }
}
