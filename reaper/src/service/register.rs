//! Registering runners: validation and the `[reaper] max_runners` cap, spawning a runner
//! (heartbeat socket, checkpoint, environment, output readers, runner row, `runner.started`),
//! and attaching an existing process (identity proven by pid + start time; stallwatch, its
//! ancestors, init and kernel threads refused). docs/design.md: Runners.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use stallwatch_storage::control::{
    AttachedRunner, RegisterError, Registered, RunnerChange, RunnerSpec, SpawnedRunner,
    TEXT_BUSY_RETRY, TEXT_BUSY_RETRY_EVERY,
};
use stallwatch_storage::keys::StopCause;
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::runners::{RunnerRow, RunnerRowState};

use crate::checkpoint_edge;
use crate::platform::{self};
use crate::runner::{self, OutputTail};
use crate::settle::{Settled, SETTLE_WAIT};
use crate::terminate::Resume;

use super::output::spawn_reader;
use super::{internal, Entry, ProcState, ReaperHandle, OWNED_PIDS};

impl ReaperHandle {
    /// `POST /api/v1/runners` (and config runners): same id alive → 409, dead → replaced.
    pub(super) async fn register(
        &self,
        spec: RunnerSpec,
        from_api: bool,
    ) -> Result<Registered, RegisterError> {
        runner::validate_spec(&spec)?;
        self.check_capacity(&spec.id)?;
        if let Some(old) = self.entry(&spec.id) {
            // Its process is gone, but its exit or stop may still be being recorded: that
            // record must not land on this registration.
            if old.alive.load(Ordering::SeqCst) || !old.settled.wait(SETTLE_WAIT).await {
                return Err(RegisterError::IdInUse(spec.id.clone()));
            }
        }
        let _ = from_api;
        if spec.spawn.is_some() {
            self.spawn_runner(spec, false)
                .await
                .map(Registered::Spawned)
        } else {
            self.attach_runner(spec, None)
                .await
                .map(Registered::Attached)
        }
    }

    /// Refuses a new runner once `[reaper] max_runners` live runners are registered
    /// (replacing a registered id does not count twice).
    fn check_capacity(&self, id: &str) -> Result<(), RegisterError> {
        let max = self.inner.config.max_runners;
        let live = self
            .inner
            .runners
            .lock()
            .map(|m| {
                let alive = |e: &Arc<Entry>| e.alive.load(Ordering::SeqCst);
                // one pass of atomic loads; the id is looked up once, not compared n times
                let all = m.values().filter(|e| alive(e)).count();
                all - usize::from(m.get(id).is_some_and(alive))
            })
            .unwrap_or(0);
        if live >= max {
            return Err(RegisterError::TooMany(format!(
                "{live} runners are registered; the limit is [reaper] max_runners = {max}"
            )));
        }
        Ok(())
    }

    /// After a wait in the spawn retry: refuses when stallwatch began stopping its runners
    /// (nothing may start after that), when another registration of `id` is alive now, or,
    /// for a restart, when `id` was deleted meanwhile.
    fn still_wanted(&self, id: &str, restarted: bool) -> Result<(), RegisterError> {
        if self.inner.stopping_all.load(Ordering::SeqCst) || self.inner.shutdown.is_cancelled() {
            return Err(RegisterError::SpawnFailed(format!(
                "runner {id} not started: stallwatch is stopping its runners"
            )));
        }
        match self.entry(id) {
            Some(e) if e.alive.load(Ordering::SeqCst) => Err(RegisterError::IdInUse(id.into())),
            None if restarted => Err(RegisterError::SpawnFailed(format!(
                "runner {id} not restarted: it was deleted"
            ))),
            _ => Ok(()),
        }
    }

    pub(super) async fn spawn_runner(
        &self,
        spec: RunnerSpec,
        restarted: bool,
    ) -> Result<SpawnedRunner, RegisterError> {
        let Some(spawn) = spec.spawn.clone() else {
            return Err(RegisterError::Invalid("no spawn section".into()));
        };
        let id = spec.id.clone();
        let cfg = &self.inner.config;
        let sock = runner::choose_socket_path(&cfg.data_dir, &id, spec.heartbeat_socket.as_deref());
        if let Some(why) = &sock.fallback_reason {
            tracing::warn!(runner = %id, "{why}");
        }
        runner::prepare_socket_dir(&sock.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                // the caller's choice of path, not our fault: a 400 naming it
                RegisterError::Invalid(format!("runner {id}: heartbeat_socket: {e}"))
            } else {
                RegisterError::SocketDir(format!(
                    "preparing heartbeat socket folder for {}: {e}",
                    sock.path.display()
                ))
            }
        })?;
        let workspace = spawn.workspace.as_deref();
        let checkpoint =
            checkpoint_edge::for_spawn(&self.inner.checkpoints, &id, workspace).await?;
        let instance_id = uuid::Uuid::new_v4().to_string();
        let env = runner::runner_env(
            cfg,
            &id,
            &spawn,
            &sock.path,
            checkpoint
                .as_ref()
                .map(|c| (c.path.as_path(), c.id.as_str())),
            &instance_id,
        );
        // Spawn and record the pid under the OWNED_PIDS lock: the unowned-zombie reaper holds
        // it while reaping, so a runner that exits at once is never taken from its owner.
        // A runner binary still open for writing is retried (TEXT_BUSY_RETRY), without the
        // lock between attempts.
        let busy_until = tokio::time::Instant::now() + TEXT_BUSY_RETRY;
        let proc = loop {
            let attempt = {
                let mut owned = OWNED_PIDS
                    .lock()
                    .map_err(|_| internal("owned pid set poisoned"))?;
                let attempt = runner::spawn_process(&spawn, &env);
                if let Ok(p) = &attempt {
                    owned.insert(p.pid);
                }
                attempt
            };
            match attempt {
                Ok(p) => break p,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                        && tokio::time::Instant::now() < busy_until =>
                {
                    tokio::time::sleep(TEXT_BUSY_RETRY_EVERY).await;
                    self.still_wanted(&id, restarted)?;
                }
                Err(e) => {
                    let what = match &spawn.cwd {
                        Some(cwd) if !cwd.is_dir() => {
                            format!("cwd {} is missing or not a folder", cwd.display())
                        }
                        _ => spawn.argv[0].clone(),
                    };
                    return Err(RegisterError::SpawnFailed(format!(
                        "cannot start runner {id} ({what}): {e}"
                    )));
                }
            }
        };
        self.inner
            .stats
            .runners_spawned
            .fetch_add(1, Ordering::Relaxed);
        let tail = OutputTail::new(cfg.tail_lines);
        let entry = Arc::new(Entry {
            id: id.clone(),
            spec: spec.clone(),
            spawned: true,
            stop_at_shutdown: true,
            pid: proc.pid,
            start_time_ticks: Some(proc.start_time_ticks),
            instance_id: instance_id.clone(),
            heartbeat_socket: Some(sock.path.clone()),
            tail: tail.clone(),
            readers: Mutex::new(Vec::new()),
            proc: tokio::sync::Mutex::new(ProcState {
                pidfd: Some(proc.pidfd),
                finished: false,
                stopping: false,
                last_report: None,
            }),
            alive: AtomicBool::new(true),
            settled: Settled::default(),
            stop_begun: AtomicBool::new(false),
        });
        let mut readers = Vec::new();
        if let Ok(out) = tokio::process::ChildStdout::from_std(proc.stdout) {
            readers.push(spawn_reader(
                out,
                "stdout",
                tail.clone(),
                id.clone(),
                instance_id.clone(),
                self.inner.storage.clone(),
            ));
        }
        if let Ok(err) = tokio::process::ChildStderr::from_std(proc.stderr) {
            readers.push(spawn_reader(
                err,
                "stderr",
                tail,
                id.clone(),
                instance_id.clone(),
                self.inner.storage.clone(),
            ));
        }
        if let Ok(mut r) = entry.readers.lock() {
            *r = readers;
        }
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let detail = serde_json::json!({
            "socket_fallback": sock.fallback_reason,
            "checkpoint_id": checkpoint.as_ref().map(|c| c.id.clone()),
        });
        let row = RunnerRow {
            id: id.clone(),
            spawned: true,
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(proc.pid),
            start_time_ticks: Some(proc.start_time_ticks),
            boot_id: Some(self.inner.boot_id.clone()),
            pgid: Some(proc.pid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: Some(sock.path.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: detail.clone(),
            registered_unix_nano: now,
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        let kind = if restarted {
            EventKind::RunnerRestarted
        } else {
            EventKind::RunnerStarted
        };
        self.incident(
            kind,
            &id,
            format!("runner {id} started as pid {}", proc.pid),
            serde_json::json!({"pid": proc.pid, "instance_id": instance_id, "argv": spawn.argv, "socket": sock.path, "socket_fallback": sock.fallback_reason}),
            format!("{}:{id}:{instance_id}", kind.as_str()),
        )
        .await;
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(proc.pid),
            heartbeat_socket: Some(sock.path.clone()),
            spawned: true,
            restarted,
        })
        .await;
        self.start_monitor(entry);
        Ok(SpawnedRunner {
            id,
            spawned: true,
            pid: proc.pid,
            start_time_ticks: proc.start_time_ticks,
            instance_id,
            heartbeat_socket: sock.path,
            socket_fallback: sock.fallback_reason,
            checkpoint: checkpoint.map(Into::into),
        })
    }

    /// Attaches an existing process. `adopt` carries a ledger `Resume` when the orphan sweep
    /// re-adopts a runner whose termination was half done.
    pub(crate) async fn attach_runner(
        &self,
        spec: RunnerSpec,
        adopt: Option<(RunnerRow, Option<Resume>)>,
    ) -> Result<AttachedRunner, RegisterError> {
        let Some(att) = spec.attach.clone() else {
            return Err(RegisterError::Invalid("no attach section".into()));
        };
        let id = spec.id.clone();
        let me = std::process::id();
        let kernel_thread = platform::proc_stat(att.pid).is_ok_and(|s| s.is_kernel_thread());
        let ancestor = platform::is_own_ancestor(att.pid);
        if att.pid <= 2 || att.pid == me || kernel_thread || ancestor {
            let why = if att.pid == me {
                "it is stallwatch itself"
            } else if ancestor {
                "it is an ancestor of stallwatch (stopping it would stop stallwatch's own parents and their other children)"
            } else if kernel_thread || att.pid == 2 {
                "it is a kernel thread"
            } else {
                "it is init"
            };
            return Err(RegisterError::Invalid(format!(
                "pid {} cannot be a runner: {why}",
                att.pid
            )));
        }
        // Another user's process is never a runner, even when stallwatch could signal it
        // (it runs as root): a desktop tool's runners are its user's own processes.
        // Both its real and its effective user: a setuid program another user started is
        // theirs too.
        if let Some((real, effective)) = platform::process_uids(att.pid) {
            let own = rustix::process::geteuid().as_raw();
            if let Some(uid) = [real, effective].into_iter().find(|u| *u != own) {
                return Err(RegisterError::Invalid(format!(
                    "pid {} cannot be a runner: it belongs to user {uid}, not to stallwatch's user {own}",
                    att.pid
                )));
            }
        }
        // `/proc/TID` exists for a thread too: without this a thread id was attached (and
        // then never seen to exit) or answered 500.
        match platform::thread_group(att.pid) {
            Ok(tgid) if tgid != att.pid => {
                return Err(RegisterError::Invalid(format!(
                    "pid {} is a thread of process {tgid}: attach the process",
                    att.pid
                )));
            }
            // No such process: the checks below say so precisely.
            Ok(_) | Err(_) => {}
        }
        let pidfd = match att.start_time_ticks {
            Some(t) => match platform::open_verified(att.pid, t).map_err(internal)? {
                Some(fd) => Some(fd),
                None => {
                    return Err(RegisterError::Gone(format!(
                        "no live process {} with start time {t}",
                        att.pid
                    )))
                }
            },
            None => {
                // Watched, never signalled: the pidfd only tells us when it exits. A zombie
                // has exited already, as with a start time (409 both ways).
                if platform::proc_stat(att.pid).is_ok_and(|s| s.state == 'Z') {
                    return Err(RegisterError::Gone(format!(
                        "process {} has exited (a zombie not yet reaped by its parent)",
                        att.pid
                    )));
                }
                if platform::proc_stat(att.pid).is_err() {
                    return Err(RegisterError::Gone(format!("no live process {}", att.pid)));
                }
                None
            }
        };
        let watch_fd = match &pidfd {
            Some(fd) => fd.try_clone().ok(),
            None => platform::pidfd_open(att.pid).ok(),
        };
        let instance_id = adopt
            .as_ref()
            .and_then(|(r, _)| r.instance_id.clone())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let entry = Arc::new(Entry {
            id: id.clone(),
            spec: spec.clone(),
            spawned: false,
            stop_at_shutdown: adopt.as_ref().is_some_and(|(r, _)| r.spawned),
            pid: att.pid,
            start_time_ticks: att.start_time_ticks,
            instance_id: instance_id.clone(),
            heartbeat_socket: spec.heartbeat_socket.clone(),
            tail: OutputTail::new(1),
            readers: Mutex::new(Vec::new()),
            proc: tokio::sync::Mutex::new(ProcState {
                pidfd,
                finished: false,
                stopping: false,
                last_report: None,
            }),
            alive: AtomicBool::new(true),
            settled: Settled::default(),
            stop_begun: AtomicBool::new(false),
        });
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let row = RunnerRow {
            id: id.clone(),
            spawned: adopt.as_ref().is_some_and(|(r, _)| r.spawned),
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(att.pid),
            start_time_ticks: att.start_time_ticks,
            boot_id: Some(self.inner.boot_id.clone()),
            pgid: platform::proc_stat(att.pid).ok().map(|s| s.pgid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: spec
                .heartbeat_socket
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: serde_json::json!({"adopted": adopt.is_some()}),
            registered_unix_nano: adopt.as_ref().map_or(now, |(r, _)| r.registered_unix_nano),
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(att.pid),
            heartbeat_socket: spec.heartbeat_socket.clone(),
            spawned: false,
            restarted: false,
        })
        .await;
        if let Some(fd) = watch_fd {
            self.start_attached_monitor(entry.clone(), fd);
        }
        if let Some((_, Some(resume))) = adopt {
            let h = self.clone();
            stallwatch_vocabulary::task::spawn_boxed(async move {
                if let Some(r) = h.stop(&entry, &StopCause::Resume, Some(resume)).await {
                    h.after_stop(&entry, &r, &StopCause::Resume, &[], None)
                        .await;
                }
            });
        }
        Ok(AttachedRunner {
            id,
            spawned: false,
            pid: att.pid,
            start_time_ticks: att.start_time_ticks,
            signalled_on_trip: att.start_time_ticks.is_some(),
            instance_id,
        })
    }
}
