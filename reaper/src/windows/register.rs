//! Registering a spawned runner on Windows: the spawn checks, the environment, the
//! suspended `CreateProcessW` in its own Job Object, and the output drains.

use super::*;

impl ReaperHandle {
    pub(super) async fn register(&self, spec: RunnerSpec) -> Result<Registered, RegisterError> {
        let bad = RegisterError::Invalid;
        if !valid_runner_id(&spec.id) {
            return Err(bad(format!(
                "runner id {:?} must match ^[a-z0-9][a-z0-9._-]{{0,62}}$",
                spec.id
            )));
        }
        let spawn = match (&spec.spawn, &spec.attach) {
            (Some(s), None) => s.clone(),
            (None, Some(_)) => {
                return Err(RegisterError::Unsupported(format!(
                    "runner {}: attaching an existing process is {UNSUPPORTED}",
                    spec.id
                )))
            }
            _ => {
                return Err(bad(format!(
                    "runner {}: exactly one of spawn or attach is required",
                    spec.id
                )))
            }
        };
        validate_spawn(&spec, &spawn)?;
        let cfg = &self.inner.config;
        let live = self
            .entries()
            .iter()
            .filter(|e| e.id != spec.id && e.exit_code().is_none())
            .count();
        if live >= cfg.max_runners {
            return Err(RegisterError::TooMany(format!(
                "{live} runners are registered; the limit is [reaper] max_runners = {}",
                cfg.max_runners
            )));
        }
        if let Some(old) = self.entry(&spec.id) {
            // Its process is gone, but its exit or stop may still be being recorded: that
            // record must not land on this registration.
            if old.exit_code().is_none() || !old.settled.wait(SETTLE_WAIT).await {
                return Err(RegisterError::IdInUse(spec.id.clone()));
            }
        }
        let id = spec.id.clone();
        let pipe = spec
            .heartbeat_socket
            .clone()
            .unwrap_or_else(|| pipe_path(&cfg.data_dir, &id));
        let workspace = spawn.workspace.as_deref();
        let checkpoint =
            checkpoint_edge::for_spawn(&self.inner.checkpoints, &id, workspace).await?;
        let instance_id = uuid::Uuid::new_v4().to_string();
        let mut env = runner_env(cfg, &id, &spawn, &pipe, &instance_id);
        if let Some(c) = &checkpoint {
            // As on Linux (reaper/src/runner.rs `runner_env`); the runner's own env wins.
            for (k, v) in [
                (
                    "STALLWATCH_CHECKPOINT_DIR",
                    c.path.to_string_lossy().into_owned(),
                ),
                ("STALLWATCH_CHECKPOINT_ID", c.id.clone()),
            ] {
                env.entry(k.to_string()).or_insert(v);
            }
        }
        let spawned = spawn_in_job(&spawn, &env);
        let (mut child, job, created) = match spawned {
            Ok(s) => s,
            Err(e) => {
                if let Some(c) = &checkpoint {
                    let _ = self
                        .inner
                        .checkpoints
                        .rollback(&c.id, "the runner did not start")
                        .await;
                }
                return Err(RegisterError::SpawnFailed(format!(
                    "cannot start runner {id} ({}): {e}",
                    spawn.argv[0]
                )));
            }
        };
        let pid = child.id().unwrap_or(0);
        self.inner
            .stats
            .runners_spawned
            .fetch_add(1, Ordering::Relaxed);
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            stallwatch_vocabulary::task::spawn_boxed(drain(out, None));
        }
        if let Some(err) = child.stderr.take() {
            stallwatch_vocabulary::task::spawn_boxed(drain(err, Some(tail.clone())));
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let entry = Arc::new(Entry {
            id: id.clone(),
            pid,
            instance_id: instance_id.clone(),
            job,
            exit: exit_rx,
            stopping: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            stop_lock: tokio::sync::Mutex::new(()),
            tail,
            settled: Settled::default(),
        });
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let row = RunnerRow {
            id: id.clone(),
            spawned: true,
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(pid),
            start_time_ticks: Some(created),
            boot_id: Some(String::new()),
            pgid: Some(pid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: Some(pipe.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: serde_json::json!({
                "platform": "windows", "job_object": true,
                "checkpoint_id": checkpoint.as_ref().map(|c| c.id.clone()),
            }),
            registered_unix_nano: now,
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        self.incident(
            EventKind::RunnerStarted,
            &id,
            format!("runner {id} started as pid {pid} in its own Job Object"),
            serde_json::json!({"pid": pid, "instance_id": instance_id, "argv": spawn.argv, "socket": pipe}),
            format!("runner.started:{id}:{instance_id}"),
        )
        .await;
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(pid),
            heartbeat_socket: Some(pipe.clone()),
            spawned: true,
            restarted: false,
        })
        .await;
        let h = self.clone();
        let monitored = entry.clone();
        stallwatch_vocabulary::task::spawn_boxed(async move {
            let code = child.wait().await.ok().and_then(|s| s.code());
            let _ = exit_tx.send(Some(code.unwrap_or(-1)));
            h.on_exit(monitored).await;
        });
        Ok(Registered::Spawned(SpawnedRunner {
            id,
            spawned: true,
            pid,
            start_time_ticks: created,
            instance_id,
            heartbeat_socket: pipe,
            socket_fallback: None,
            checkpoint: checkpoint.map(Into::into),
        }))
    }
}

/// The spawn checks of the Linux reaper that apply here, plus a heartbeat path that is a
/// named pipe. (The workspace is checked when its checkpoint is created.)
pub(super) fn validate_spawn(spec: &RunnerSpec, spawn: &SpawnSpec) -> Result<(), RegisterError> {
    let bad = RegisterError::Invalid;
    if spawn.argv.is_empty() || spawn.argv[0].is_empty() {
        return Err(bad(format!("runner {}: spawn.argv is empty", spec.id)));
    }
    if let Some(k) = spawn
        .env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(bad(format!(
            "runner {}: env key {k:?} must be non-empty, without '=' or NUL",
            spec.id
        )));
    }
    if let Some(cwd) = &spawn.cwd {
        if !cwd.is_dir() {
            return Err(bad(format!(
                "runner {}: cwd {} is missing or not a folder",
                spec.id,
                cwd.display()
            )));
        }
    }
    if let Some(p) = &spec.heartbeat_socket {
        if !p.to_string_lossy().starts_with(r"\\.\pipe\") {
            return Err(bad(format!(
                r"runner {}: heartbeat_socket {} must be a named pipe (\\.\pipe\...) on Windows",
                spec.id,
                p.display()
            )));
        }
    }
    Ok(())
}

/// The injected environment, as on Linux (docs/design.md, Interfaces: Runners): inherited <
/// injected < the runner's own `env`, except stallwatch's own `STALLWATCH_*` variables.
pub(super) fn runner_env(
    config: &ReaperConfig,
    id: &str,
    spawn: &SpawnSpec,
    pipe: &Path,
    instance_id: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("STALLWATCH_RUNNER_ID".into(), id.into());
    env.insert("STALLWATCH_RUNNER_INSTANCE".into(), instance_id.into());
    env.insert(
        "STALLWATCH_HEARTBEAT_SOCKET".into(),
        pipe.to_string_lossy().into_owned(),
    );
    env.insert(
        crate::config::HEARTBEAT_TIMEOUT_ENV.into(),
        config.heartbeat_timeout.as_millis().to_string(),
    );
    env.insert(
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        config.otlp_endpoint.clone(),
    );
    env.insert("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into());
    if let Some(h) = &config.otlp_headers {
        env.insert("OTEL_EXPORTER_OTLP_HEADERS".into(), h.clone());
    }
    env.insert("OTEL_SERVICE_NAME".into(), id.into());
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    crate::env::layer_spec_env(&mut env, &spawn.env, id);
    let theirs = spawn
        .env
        .get("OTEL_RESOURCE_ATTRIBUTES")
        .map(String::as_str)
        .unwrap_or("");
    env.insert(
        "OTEL_RESOURCE_ATTRIBUTES".into(),
        crate::env::merge_resource_attributes(theirs, id, instance_id),
    );
    env
}

/// Creates the runner suspended in its own console process group, puts it into a fresh
/// Job Object, then resumes it. Answers the child, its job and its creation time (100 ns
/// ticks since 1601, `GetProcessTimes`). On any failure after creation the job is dropped,
/// which ends the process (kill-on-job-close) or the child is killed.
pub(super) fn spawn_in_job(
    spawn: &SpawnSpec,
    env: &BTreeMap<String, String>,
) -> std::io::Result<(tokio::process::Child, process::Job, u64)> {
    use windows_sys::Win32::System::Threading::{CREATE_NEW_PROCESS_GROUP, CREATE_SUSPENDED};
    let mut cmd = tokio::process::Command::new(&spawn.argv[0]);
    cmd.args(&spawn.argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .creation_flags(CREATE_NEW_PROCESS_GROUP | CREATE_SUSPENDED);
    for k in crate::env::scrubbed_names(crate::env::inherited_names(), &spawn.env) {
        cmd.env_remove(k);
    }
    cmd.envs(env);
    if let Some(cwd) = &spawn.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn()?;
    let placed: std::io::Result<(process::Job, u64)> = (|| {
        let job = process::Job::new()?;
        let raw = child
            .raw_handle()
            .ok_or_else(|| std::io::Error::other("the runner has no process handle"))?;
        job.assign(raw)?;
        let created = process::creation_time(raw)?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("the runner has no pid"))?;
        process::resume_threads(pid)?;
        Ok((job, created))
    })();
    match placed {
        Ok((job, created)) => Ok((child, job, created)),
        Err(e) => {
            let _ = child.start_kill();
            Err(e)
        }
    }
}

/// Reads a runner's output so its pipe never fills; stderr lines go to the tail.
pub(super) async fn drain<R>(r: R, tail: Option<Arc<Mutex<VecDeque<String>>>>)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(t) = &tail {
            if let Ok(mut t) = t.lock() {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    }
}
