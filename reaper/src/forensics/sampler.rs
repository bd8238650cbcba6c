//! The forensics task: the CPU sampler behind "0% CPU for 58 s" (every
//! `forensics_sample_ms`), stacks-file cleanup, and evidence for `verdict.suspect`
//! incidents from the event bus (issue 18; `docs/design.md`, Stall forensics).
//!
//! The sampler reads `/proc` only for the runners that can be tripped (issue 17 #10: with
//! 2,000 runners, reading every one every period starved the runtime): those the watchdog's
//! board shows with an open tool span (from its start, so "CPU since the span started"
//! means what it says), with a verdict other than healthy (a suspect), or with a heartbeat
//! that is failing to answer ([`needs_sampling`]). Without a board (a reaper alone) it
//! samples every live runner.

use std::collections::HashSet;

use stallwatch_storage::control::RunnerStatus;
use stallwatch_storage::labels::HeartbeatLabel;

use super::*;

/// Whether the CPU sampler reads a runner this period, from its board entry (`None`: the
/// board does not know it yet, so it is read). Healthy runners with no open tool span and
/// a heartbeat that answers (or none configured, or one whose socket was never created)
/// are left alone; the evidence of a trip without history says so (`cpu.samples = 0`).
pub fn needs_sampling(status: Option<&RunnerStatus>) -> bool {
    let Some(st) = status else { return true };
    if st.verdict == "gone" {
        return false;
    }
    if st.verdict != "healthy" {
        return true;
    }
    let answering_badly = matches!(
        st.heartbeat,
        HeartbeatLabel::Lost
            | HeartbeatLabel::Timeout
            | HeartbeatLabel::BadAnswer
            | HeartbeatLabel::ConnectionRefused
            | HeartbeatLabel::IoError
    );
    answering_badly || st.worst_span.is_some()
}

impl Forensics {
    /// Follows the watchdog's board: from now on the sampler reads only the runners
    /// `needs_sampling` picks. Set once; later calls are ignored.
    pub fn follow_board(&self, board: watch::Receiver<RunnerBoard>) {
        let _ = self.board.set(board);
    }

    /// The `(pid, instance_id)` of `live` runners (`(id, pid, instance_id)`) that the
    /// sampler reads this period.
    pub fn to_sample(&self, live: &[(String, u32, String)]) -> Vec<(u32, String)> {
        let pick = |r: &(String, u32, String)| (r.1, r.2.clone());
        match self.board.get() {
            None => live.iter().map(pick).collect(),
            Some(rx) => {
                let board = rx.borrow().clone();
                live.iter()
                    .filter(|r| needs_sampling(board.get(&r.0)))
                    .map(pick)
                    .collect()
            }
        }
    }

    /// Takes one CPU sample of each of `sampled` (`(pid, instance_id)`) and forgets the
    /// histories of processes not in `live`.
    pub fn sample(&self, sampled: &[(u32, String)], live: &[(u32, String)]) {
        let now = Instant::now();
        let at_unix_nano = now_unix_nano();
        let samples: Vec<((u32, String), Sample)> = sampled
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
        let live: HashSet<(u32, &str)> = live.iter().map(|(p, i)| (*p, i.as_str())).collect();
        if let Ok(mut h) = self.histories.lock() {
            h.retain(|k, _| live.contains(&(k.0, k.1.as_str())));
            for (k, s) in samples {
                h.entry(k).or_default().push(s);
            }
        }
    }

    /// Removes what runners no longer registered left in `<data_dir>/run/`: stacks files
    /// (`<id>.<instance>.stacks`, and what a kit names after one) of instances not in
    /// `current` (`(id, instance_id)`), and heartbeat sockets (`<id>.sock`, only if it is a
    /// socket at least `stale_socket_age` old, `STALE_SOCKET_AGE` outside tests, that no
    /// process accepts connections on) of runner ids not in it. Whatever belongs to a runner
    /// whose socket is live stays: it still runs (a runner of the previous run, before the
    /// orphan sweep registers it again). The folder is this instance's own (its data folder is locked), so
    /// nothing there belongs to another stallwatch.
    pub fn clean_run_dir(&self, current: &[(String, String)], stale_socket_age: Duration) {
        let dir_path = self.data_dir.join("run");
        let Ok(dir) = std::fs::read_dir(&dir_path) else {
            return;
        };
        let instances: HashSet<String> = current
            .iter()
            .map(|(id, inst)| format!("{id}.{inst}"))
            .collect();
        let ids: HashSet<&str> = current.iter().map(|(id, _)| id.as_str()).collect();
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".sock") {
                // A socket bound in the last minute may be a runner's being registered or
                // restarted right now: removing it would cost a healthy runner its heartbeat.
                let stale = e.metadata().is_ok_and(|m| {
                    std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())
                        && m.modified()
                            .ok()
                            .and_then(|t| t.elapsed().ok())
                            .is_some_and(|age| age >= stale_socket_age)
                });
                // A socket a process still accepts connections on is a live runner's: one
                // re-adopted after a restart, before the orphan sweep registers it again
                // (removing it cost a healthy runner its heartbeat, and then its life).
                if stale && !ids.contains(id) && !crate::runner::socket_in_use(&e.path()) {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            // `<id>.<instance>.stacks` and files a kit names after it (`....stacks.report.json`).
            let Some(stem) = name.find(".stacks").map(|i| &name[..i]) else {
                continue;
            };
            // A runner not registered keeps its files while its heartbeat socket is live
            // (its process still runs and may be re-adopted with that very instance).
            let live = stem.rsplit_once('.').is_some_and(|(id, _)| {
                !ids.contains(id)
                    && crate::runner::socket_in_use(&dir_path.join(format!("{id}.sock")))
            });
            if !instances.contains(stem) && !live {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// How old a heartbeat socket of a runner no longer registered must be before
/// [`Forensics::clean_run_dir`] removes it: one bound in the last minute may be a runner's
/// being registered or restarted right now.
pub const STALE_SOCKET_AGE: Duration = Duration::from_secs(60);

/// Resolves when the followed board changes (true) or its sender is gone (false); never
/// without one.
async fn board_changed(board: &mut Option<watch::Receiver<RunnerBoard>>) -> bool {
    match board {
        Some(b) => b.changed().await.is_ok(),
        None => std::future::pending().await,
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
    stallwatch_vocabulary::task::spawn_boxed(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u64;
        // With no runner registered and the watchdog's board followed, the sampler waits
        // for the board to change instead of ticking (a registration changes it), so an
        // idle stallwatch reads nothing and wakes for nothing (issue 16: idle wake-ups).
        let mut idle: Option<watch::Receiver<RunnerBoard>> = None;
        loop {
            tokio::select! {
                _ = reaper.shutdown_token().cancelled() => break,
                changed = board_changed(&mut idle) => {
                    idle = None;
                    if changed {
                        tick.reset_immediately();
                    }
                }
                _ = tick.tick(), if idle.is_none() => {
                    // The board is marked seen before the runners are read, so a
                    // registration in between still wakes the idle wait.
                    let board = reaper.forensics().board.get().map(|b| {
                        let mut b = b.clone();
                        b.mark_unchanged();
                        b
                    });
                    let runners = reaper.forensics_runners();
                    if runners.is_empty() {
                        if let Some(board) = board {
                            reaper.forensics().clean_run_dir(&[], STALE_SOCKET_AGE);
                            reaper.forensics().sample(&[], &[]);
                            idle = Some(board);
                            continue;
                        }
                    }
                    let live: Vec<(u32, String)> = runners.iter().map(|r| (r.1, r.2.clone())).collect();
                    let fx2 = reaper.forensics();
                    let sampled = fx2.to_sample(&runners);
                    let _ = tokio::task::spawn_blocking(move || fx2.sample(&sampled, &live)).await;
                    ticks += 1;
                    if ticks % 32 == 1 {
                        let current: Vec<(String, String)> = runners.into_iter().map(|r| (r.0, r.2)).collect();
                        reaper.forensics().clean_run_dir(&current, STALE_SOCKET_AGE);
                    }
                }
                ev = events.recv() => match ev {
                    Ok(inc) => {
                        let Some(id) = suspect_runner(inc.incident.kind, inc.incident.runner_id.as_deref()) else { continue };
                        if inc.id <= 0 { continue; }
                        if let Some(subject) = reaper.forensics_subject(id).await {
                            let r = reaper.clone();
                            let inc_id = inc.id;
                            stallwatch_vocabulary::task::spawn_boxed(async move {
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

#[cfg(test)]
mod tests {
    use super::*;
    use stallwatch_storage::control::{BreakerState, RunnerLifecycle, WorstSpan};
    use stallwatch_storage::model::{SpanId, TraceId};

    fn status(verdict: &str, hb: HeartbeatLabel, span: Option<(u64, u64)>) -> RunnerStatus {
        RunnerStatus {
            id: "r".into(),
            pid: Some(1),
            spawned: true,
            lifecycle: RunnerLifecycle::Running,
            breaker: BreakerState::Closed,
            verdict: verdict.into(),
            reason: String::new(),
            retry_after_ms: None,
            heartbeat: hb,
            heartbeat_rtt_us: Vec::new(),
            worst_span: span.map(|(elapsed_ms, sla_ms)| WorstSpan {
                trace_id: TraceId([1; 16]),
                span_id: SpanId([2; 8]),
                tool_name: "t".into(),
                elapsed_ms,
                sla_ms,
                stale: false,
            }),
        }
    }

    #[test]
    fn the_run_folder_loses_what_unregistered_runners_left_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        let fx = Forensics::new(&crate::config::ReaperConfig::new(dir.path()));
        let _live = std::os::unix::net::UnixListener::bind(run.join("live.sock")).unwrap();
        // A runner not registered (yet) whose process still serves its socket: one the
        // orphan sweep is about to re-adopt after a restart.
        let _adopted = std::os::unix::net::UnixListener::bind(run.join("adopted.sock")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(run.join("gone.sock")).unwrap());
        std::fs::write(run.join("plain.sock"), b"not a socket").unwrap();
        for f in [
            "live.i2.stacks",
            "live.i1.stacks",
            "live.i1.stacks.report.json",
            "gone.i9.stacks",
            "adopted.i7.stacks",
        ] {
            std::fs::write(run.join(f), b"x").unwrap();
        }
        let current = vec![("live".to_string(), "i2".to_string())];
        // A fresh socket is kept even when its runner is not registered (one being
        // registered or restarted right now).
        fx.clean_run_dir(&current, STALE_SOCKET_AGE);
        assert!(run.join("gone.sock").exists());
        fx.clean_run_dir(&current, Duration::ZERO);
        let mut left: Vec<String> = std::fs::read_dir(&run)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "adopted.i7.stacks",
                "adopted.sock",
                "live.i2.stacks",
                "live.sock",
                "plain.sock"
            ]
        );
    }

    #[test]
    fn only_runners_that_can_trip_are_sampled() {
        use HeartbeatLabel::*;
        let yes = |v: &str, hb, span| needs_sampling(Some(&status(v, hb, span)));
        // healthy and idle: left alone
        assert!(!yes("healthy", Ok, None));
        assert!(!yes("healthy", NotConfigured, None));
        assert!(!yes("healthy", SocketMissing, None));
        assert!(!yes("gone", NotRunning, None));
        // an open tool span (from its start), a suspect, a failing heartbeat, an unknown one
        assert!(yes("healthy", Ok, Some((0, 1000))));
        assert!(yes("suspect", Lost, Some((10, 1000))));
        assert!(yes("healthy", Timeout, None));
        assert!(yes("healthy", BadAnswer, None));
        assert!(needs_sampling(None));
    }
}
