//! `stallwatch serve`: builds every stage, wires the channels between them (the table in
//! ARCHITECTURE.md), prints the `ready` line, and shuts down in order.
//!
//! Shutdown order (SIGTERM, SIGINT or `POST /api/v1/shutdown`): mark not ready → stop OTLP
//! intake and finish in-flight exports → stop spawned runners (normal termination) → stop
//! the watchdog and reaper → stop the dashboard and webhook worker → stop the `[forward]`
//! forwarder → storage commits what is queued and stops. Each stage has its own deadline.
//! A second stop signal (SIGTERM or SIGINT; a console control event on Windows) hurries
//! it: spawned runners still stopping get SIGKILL (`TerminateJobObject`) at once, and the
//! intake, dashboard, webhook and forwarder stages are no longer waited for; the watchdog,
//! the reaper and storage still stop in order.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use stallwatch_collector::{Collector, CollectorConfig};
use stallwatch_dashboards::{AppState, DashboardConfig};
use stallwatch_reaper::{Reaper, ReaperConfig};
use stallwatch_storage::control::{ControlRequest, Observation, RunnerChange, Trip};
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident};
use stallwatch_storage::{EventBus, MetricsSource, Storage, StorageConfig};
use stallwatch_watchdog::{Watchdog, WatchdogConfig};

use crate::cli::{LogFormat, ServeArgs};
use crate::config::{self, Settings};
use crate::datadir::DataDir;

/// Observations waiting for the watchdog (export requests).
const OBSERVATION_QUEUE: usize = 1024;
/// Trips waiting for the reaper.
const TRIP_QUEUE: usize = 256;
/// Runner lifecycle notices waiting for the watchdog.
const RUNNER_CHANGE_QUEUE: usize = 256;
/// Control requests waiting for routing.
const CONTROL_QUEUE: usize = 64;
/// Deadline for each shutdown stage.
const STAGE_DEADLINE: Duration = Duration::from_secs(10);
/// A stop signal within this long of the first one is taken for the same request (a
/// supervisor such as `timeout(1)` signals the process and then its process group), not for
/// a second one that hurries the shutdown.
const SAME_STOP_REQUEST: Duration = Duration::from_millis(250);
/// After a second stop signal, how long the hurried termination sequences of the spawned
/// runners are still waited for (they send SIGKILL within a poll) before the last resort,
/// `kill_all_registered`.
const HURRIED_STOP_WAIT: Duration = Duration::from_secs(6);

/// Where `serve` stands with JSON logs, for [`report_fatal`]: 0 text, 1 JSON asked for
/// (`--log-format json` or `STALLWATCH_LOG_FORMAT`) before logging started, 2 JSON logging
/// started.
static JSON_LOGS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Reports the error `serve` ended with as one JSON log line (the configured format's shape:
/// `level` `ERROR`, `fields.message`) when JSON logs were asked for, so a supervisor reading
/// stderr as JSON lines gets no plain text; returns false (the caller prints plain text)
/// otherwise. Covers errors before logging started (a bad config) and after (a port in use).
pub fn report_fatal(err: &anyhow::Error) -> bool {
    use std::sync::atomic::Ordering;
    match JSON_LOGS.load(Ordering::Relaxed) {
        0 => return false,
        1 => init_json_fallback(),
        _ => {}
    }
    tracing::error!("stallwatch: error: {}", crate::error_chain(err));
    true
}

/// Logging for an error reported before [`init_logging`] ran while JSON logs were asked
/// for: JSON lines on stderr, the shape `init_logging` gives them.
pub(crate) fn init_json_fallback() {
    let _ = tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .try_init();
}

/// Parses settings, opens the data folder, and runs the sidecar until it is told to stop.
pub fn run(args: ServeArgs) -> Result<()> {
    use std::sync::atomic::Ordering;
    if args.log_format == Some(LogFormat::Json) {
        JSON_LOGS.store(1, Ordering::Relaxed);
    }
    let settings = config::merge(&args)?;
    let self_traces = init_logging(settings.log_format, args.self_traces);
    JSON_LOGS.store(
        if settings.log_format == LogFormat::Json {
            2
        } else {
            0
        },
        Ordering::Relaxed,
    );
    check_config(&settings)?;
    let data = DataDir::open(&settings.data_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("stallwatch")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(settings, data, args.exit_with_parent, self_traces))
}

/// Logs on stderr (filtered by `RUST_LOG`, default `info`: [`crate::logfilter`]), plus the
/// self-trace layer (unfiltered by `RUST_LOG`) when asked for; answers the self-trace sink.
fn init_logging(format: LogFormat, self_traces: bool) -> Option<crate::selftrace::SelfTraceSink> {
    use tracing_subscriber::prelude::*;
    let (filter, invalid) = match crate::logfilter::env_filter(
        std::env::var_os("RUST_LOG"),
        tracing::level_filters::STATIC_MAX_LEVEL,
    ) {
        Ok(f) => (f, None),
        Err(e) => (crate::logfilter::default_filter(), Some(e)),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let (layer, sink) = if self_traces {
        let (l, s) = crate::selftrace::layer();
        // Only stallwatch's own spans: dependency spans (h2, hyper) stay disabled.
        let l = l.with_filter(tracing_subscriber::filter::filter_fn(
            crate::selftrace::ours,
        ));
        (Some(l), Some(s))
    } else {
        (None, None)
    };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(layer)
        .init();
    if let Some(e) = invalid {
        tracing::warn!(
            rust_log = ?e.value,
            error = %e.error,
            default = %crate::logfilter::DEFAULT_LEVEL,
            "RUST_LOG is not a valid filter; logging with the default"
        );
    }
    sink
}

/// Validates every section the way `serve` will, before the data folder is created: a
/// value out of range (`heartbeat_interval_ms = 0`, a bad webhook URL or glob) is reported
/// with nothing created, like a parse error (it was reported after the database, token and
/// reserve were made). Same errors, same context, as the conversions in `serve`.
fn check_config(settings: &Settings) -> Result<()> {
    StorageConfig::try_from((
        settings.storage.clone(),
        settings.data_dir.join("stallwatch.db"),
    ))?;
    WatchdogConfig::try_from(settings.watchdog.clone()).context("invalid [watchdog] section")?;
    ReaperConfig::try_from(stallwatch_reaper::ReaperConfigInput {
        raw: settings.reaper.clone(),
        data_dir: settings.data_dir.clone(),
        runners: settings.runners.clone(),
    })
    .context("invalid [reaper] section or [[runner]]")?;
    DashboardConfig::try_from((settings.dashboard.clone(), settings.alerts.clone()))
        .context("invalid [dashboard] or [alerts] section")?;
    CollectorConfig::try_from(settings.otlp.clone()).context("invalid [otlp] section")?;
    if let Some(raw) = settings.forward.clone() {
        let raw = raw
            .with_env(|k| std::env::var(k).ok())
            .context("invalid [forward] section")?;
        stallwatch_forward::ForwardConfig::try_from(raw).context("invalid [forward] section")?;
    }
    Ok(())
}

async fn serve(
    settings: Settings,
    data: DataDir,
    exit_with_parent: bool,
    self_traces: Option<crate::selftrace::SelfTraceSink>,
) -> Result<()> {
    let mut signals = StopSignals::install()?;
    // Our own fd shortage must never look like a runner's fault (issue 17 #11).
    match stallwatch_reaper::platform::raise_nofile_limit() {
        Ok((old, new)) => tracing::debug!(
            ?old,
            ?new,
            "RLIMIT_NOFILE soft limit raised to the hard limit"
        ),
        Err(e) => tracing::warn!("cannot raise RLIMIT_NOFILE: {e}"),
    }
    let shutdown = CancellationToken::new();
    if exit_with_parent {
        // Fail fast (before binding anything) when the parent cannot be watched.
        let watch = crate::parent::parent_exited();
        let token = shutdown.clone();
        let mut watch = Box::pin(watch);
        tokio::select! {
            biased;
            r = &mut watch => { r?; anyhow::bail!("--exit-with-parent: the parent exited during start-up"); }
            _ = std::future::ready(()) => {}
        }
        stallwatch_vocabulary::task::spawn_boxed(async move {
            match watch.await {
                Ok(pid) => tracing::warn!(parent_pid = pid, "parent process exited; shutting down"),
                Err(e) => tracing::error!("{e:#}"),
            }
            token.cancel();
        });
    }
    let storage_config = StorageConfig::try_from((settings.storage, data.db_path()))?;
    // A disk full at start must not leave runners unwatched (issue 17 #13): free the reserve
    // so SQLite can open its files, and start degraded.
    let full_at_start = data.disk_full();
    if full_at_start {
        let freed = data.release_reserve();
        tracing::error!(
            data_dir = %data.path.display(),
            reserve_freed = freed,
            "the disk is full at start: starting degraded (telemetry refused with 503, runners watched and stopped, control records held until space returns)"
        );
    }
    let storage = Storage::open(storage_config).context("cannot open the database")?;
    let events = EventBus::new(storage.clone());
    if full_at_start {
        storage.pause_ingest(Some(format!(
            "the disk was full at start; {}",
            crate::datadir::UNTIL_SPACE_RETURNS
        )));
        let at = now_unix_nano();
        let incident = NewIncident {
            kind: EventKind::StorageFull,
            runner_id: None,
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason: "disk full at start: started degraded (telemetry refused, runners watched and stopped)".into(),
            evidence: serde_json::json!({ "free_bytes": data.free_bytes(), "degraded_start": true }),
            idempotency_key: stallwatch_storage::keys::storage_full_at_start(at),
            at_unix_nano: at,
        };
        if let Err(e) = events.publish(incident).await {
            tracing::warn!("storage.full incident not recorded: {e}");
        }
    } else {
        data.ensure_reserve();
    }
    let reserve_task = stallwatch_vocabulary::task::spawn_boxed(keep_reserve(
        data.path.clone(),
        storage.clone(),
        full_at_start,
    ));
    let self_trace_task = self_traces.map(|sink| {
        stallwatch_vocabulary::task::spawn_boxed(crate::selftrace::run_writer(
            sink,
            storage.clone(),
        ))
    });

    // Forwarder: every accepted span, log and metric point upstream (`[forward]`).
    let forwarder = match settings.forward {
        None => None,
        Some(raw) => {
            // Keys the section leaves unset come from the standard OTEL_EXPORTER_OTLP_*
            // variables (runners never inherit those: the reaper scrubs them).
            let raw = raw
                .with_env(|k| std::env::var(k).ok())
                .context("invalid [forward] section")?;
            let fc = stallwatch_forward::ForwardConfig::try_from(raw)
                .context("invalid [forward] section")?;
            Some(stallwatch_forward::Forwarder::start(fc, storage.clone())?)
        }
    };

    let (obs_tx, obs_rx) = mpsc::channel::<Observation>(OBSERVATION_QUEUE);
    let (trip_tx, trip_rx) = mpsc::channel::<Trip>(TRIP_QUEUE);
    let (change_tx, mut change_rx) = mpsc::channel::<RunnerChange>(RUNNER_CHANGE_QUEUE);
    let (wd_change_tx, wd_change_rx) = mpsc::channel::<RunnerChange>(RUNNER_CHANGE_QUEUE);
    let (control_tx, mut control_rx) = mpsc::channel::<ControlRequest>(CONTROL_QUEUE);

    // Watchdog: decides.
    let wd_config =
        WatchdogConfig::try_from(settings.watchdog).context("invalid [watchdog] section")?;
    let heartbeat_timeout = wd_config.heartbeat_timeout;
    let wd_token = CancellationToken::new();
    let (watchdog, wd_task) = Watchdog::start(
        wd_config,
        storage.clone(),
        events.clone(),
        obs_rx,
        wd_change_rx,
        trip_tx,
        wd_token.clone(),
    );

    // Reaper: acts.
    let endpoint_configured = settings.reaper.otlp_endpoint.is_some();
    let mut reaper_config = ReaperConfig::try_from(stallwatch_reaper::ReaperConfigInput {
        raw: settings.reaper,
        data_dir: data.path.clone(),
        runners: settings.runners,
    })
    .context("invalid [reaper] section or [[runner]]")?;
    reaper_config.heartbeat_timeout = heartbeat_timeout;
    let reaper_token = CancellationToken::new();

    // Dashboard config first: its `allowed_hosts` is the one Host rule of every listener.
    let mut dash_config = DashboardConfig::try_from((settings.dashboard, settings.alerts))
        .context("invalid [dashboard] or [alerts] section")?;

    // Collector: binds now so port 0 resolves before the reaper injects the endpoint.
    let ingest_token = settings.otlp.ingest_token.clone();
    let mut collector_config =
        CollectorConfig::try_from(settings.otlp).context("invalid [otlp] section")?;
    collector_config.allowed_hosts = dash_config.allowed_hosts.clone();
    let collector = Collector::bind(collector_config, storage.clone(), obs_tx)
        .await
        .context("cannot bind the OTLP listeners")?;
    if let Some(token) = &ingest_token {
        // Spawned runners must be able to export when an ingest token is required
        // (OTEL_EXPORTER_OTLP_HEADERS values are percent-encoded: the space is %20).
        reaper_config.otlp_headers = Some(format!("authorization=Bearer%20{token}"));
    }
    if !endpoint_configured {
        // Spawned runners export to the HTTP listener actually bound (port 0 resolved).
        reaper_config.otlp_endpoint =
            format!("http://{}", loopback_for_clients(collector.http_addr()));
    }
    let (reaper, reaper_task) = Reaper::start(
        reaper_config,
        storage.clone(),
        events.clone(),
        trip_rx,
        change_tx,
        reaper_token.clone(),
    )
    .await
    .context("cannot start the reaper")?;
    // Forensics samples only the runners the board shows can trip; the Windows reaper has
    // no forensics yet (docs/platforms.md), so nothing there follows the board.
    #[cfg(unix)]
    reaper.follow_board(watchdog.board());

    // Lifecycle notices: reaper → watchdog (named in ARCHITECTURE.md).
    let forward_changes = stallwatch_vocabulary::task::spawn_boxed(async move {
        while let Some(change) = change_rx.recv().await {
            if wd_change_tx.send(change).await.is_err() {
                break;
            }
        }
    });

    // Dashboard.
    let listener = tokio::net::TcpListener::bind(dash_config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (dashboard)", dash_config.listen))?;
    let dashboard_addr = listener.local_addr()?;
    dash_config.listen = dashboard_addr;
    let (ready_tx, ready_rx) = watch::channel(false);
    let [grpc_stats, http_stats] = collector.listener_stats();
    let dash_stats = stallwatch_storage::listen::ListenerStats::new("dashboard");
    let mut metrics: Vec<Arc<dyn MetricsSource>> = vec![
        collector.stats(),
        Arc::new(stallwatch_storage::listen::ListenerMetrics(vec![
            grpc_stats,
            http_stats,
            dash_stats.clone(),
        ])),
        storage.telemetry_stats(),
        watchdog.stats(),
        reaper.stats(),
    ];
    if let Some(f) = &forwarder {
        metrics.push(f.stats());
    }
    let dash_config = Arc::new(dash_config);
    let state = AppState {
        storage: storage.clone(),
        events: events.clone(),
        board: watchdog.board(),
        control: control_tx,
        token: data.token.clone(),
        metrics,
        ready: ready_rx,
        config: dash_config.clone(),
        // Drop-to-import replays on the collector's own OTLP/HTTP router (same ingest path).
        otlp_import: Some(stallwatch_dashboards::OtlpImport {
            router: stallwatch_collector::http_app(collector.state()),
            ingest_token: ingest_token.clone(),
        }),
    };
    let dash_token = CancellationToken::new();
    let app = stallwatch_dashboards::app(state);
    let dash_task = stallwatch_vocabulary::task::spawn_boxed(stallwatch_dashboards::serve_with(
        listener,
        app,
        dash_config.listen_limits,
        dash_stats,
        dash_token.clone(),
    ));
    let webhooks = stallwatch_dashboards::start_webhooks(
        dash_config.clone(),
        storage.clone(),
        events.clone(),
        dash_token.clone(),
    );

    // Storage-full alarm → `storage.full` incident.
    let full_task = stallwatch_vocabulary::task::spawn_boxed(watch_storage_full(
        storage.clone(),
        events.clone(),
    ));

    // Control routing: the one reverse edge.
    let control_shutdown = shutdown.clone();
    let wd_for_control = watchdog.clone();
    let reaper_for_control = reaper.clone();
    let control_task = stallwatch_vocabulary::task::spawn_boxed(async move {
        while let Some(req) = control_rx.recv().await {
            match req {
                ControlRequest::Shutdown => control_shutdown.cancel(),
                ControlRequest::ResetBreaker { id, reply } => {
                    use stallwatch_storage::control::{BreakerReset, BreakerState, RunnerError};
                    let answer = match wd_for_control.reset_breaker(&id).await {
                        Ok(()) => Ok(BreakerReset {
                            id,
                            state: BreakerState::Closed,
                        }),
                        Err(e) => Err(RunnerError::NotFound(e.to_string())),
                    };
                    let _ = reply.send(answer);
                }
                other => {
                    let reaper = reaper_for_control.clone();
                    stallwatch_vocabulary::task::spawn_boxed(
                        async move { reaper.handle(other).await },
                    );
                }
            }
        }
    });

    let collector_token = CancellationToken::new();
    let grpc_addr = collector.grpc_addr();
    let http_addr = collector.http_addr();
    let collector_task = tokio::spawn(collector.run(collector_token.clone()));

    for (what, addr) in [
        ("OTLP/gRPC", grpc_addr),
        ("OTLP/HTTP", http_addr),
        ("dashboard", dashboard_addr),
    ] {
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "{what} listens beyond loopback: other machines can reach it (the read API has no token; set [otlp] ingest_token)");
        }
    }
    // Keys in the design's order (serde_json's map would sort them).
    let ready = format!(
        "{{\"event\":\"ready\",\"otlp_grpc\":{},\"otlp_http\":{},\"dashboard\":{},\"data_dir\":{}}}",
        serde_json::Value::from(grpc_addr.to_string()),
        serde_json::Value::from(http_addr.to_string()),
        serde_json::Value::from(dashboard_addr.to_string()),
        serde_json::Value::from(data.path.display().to_string()),
    );
    // Ready first, the line last: whoever reads the ready line (or ready.json) may ask
    // /readyz at once and must get 200.
    let _ = ready_tx.send(true);
    let discovery = write_discovery(&data.path, &ready)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{ready}").context("cannot write the ready line")?;
        out.flush()?;
    }
    tracing::info_span!("stallwatch.ready", otlp_grpc = %grpc_addr, otlp_http = %http_addr, dashboard = %dashboard_addr)
        .in_scope(|| tracing::info!(data_dir = %data.path.display(), "stallwatch ready"));

    let residency_task =
        stallwatch_vocabulary::task::spawn_boxed(release_code_pages_while_running());

    // A stage that ends before shutdown was asked (a panic: a bug; a listener that failed)
    // leaves stallwatch without part of itself, e.g. a watchdog that trips nothing while
    // exports still succeed. That is fatal: a `sidecar.degraded` incident, the ordered
    // shutdown below, then exit code 1, so whoever supervises the sidecar starts it again
    // and its orphan sweep closes what was left open.
    let (mut wd_task, mut reaper_task) = (wd_task, reaper_task);
    let (mut collector_task, mut dash_task) = (collector_task, dash_task);
    let ended_early: Option<(&'static str, String)> = tokio::select! {
        () = signals.wait(&shutdown) => None,
        r = &mut wd_task => Some(("watchdog", task_end(r.map(|()| Ok::<(), String>(()))))),
        r = &mut reaper_task => Some(("reaper", task_end(r.map(|()| Ok::<(), String>(()))))),
        r = &mut collector_task => Some(("collector", task_end(r))),
        r = &mut dash_task => Some(("dashboard", task_end(r))),
    };
    if let Some((stage, why)) = &ended_early {
        let why = format!("the {stage} stopped while running: {why}; stallwatch shuts down so it can be started again");
        tracing::error!(stage, "{why}");
        let at = now_unix_nano();
        let incident = NewIncident {
            kind: EventKind::SidecarDegraded,
            runner_id: None,
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason: why.clone(),
            evidence: serde_json::json!({ "stage": stage, "why": why }),
            idempotency_key: stallwatch_storage::keys::sidecar_degraded(at),
            at_unix_nano: at,
        };
        if let Err(e) = events.publish(incident).await {
            tracing::error!("sidecar.degraded not recorded: {e}");
        }
    }
    let early = |name: &str| ended_early.as_ref().is_some_and(|(s, _)| *s == name);
    tracing::info!("shutting down");
    // A second stop signal hurries the shutdown (a user pressing Ctrl-C again, a supervisor
    // that sends SIGTERM twice): spawned runners get SIGKILL now instead of the rest of
    // their grace period, open connections are dropped; storage still commits what it
    // holds, and the next start's orphan sweep closes what was left open.
    let hurry = CancellationToken::new();
    let first_signal = std::time::Instant::now();
    let hurry_task = stallwatch_vocabulary::task::spawn_boxed({
        let hurry = hurry.clone();
        let reaper = reaper.clone();
        async move {
            // A signal right after the first is the same request sent twice (`timeout(1)`
            // signals both the process and its group), not a user asking again.
            loop {
                signals.wait(&CancellationToken::new()).await;
                if first_signal.elapsed() >= SAME_STOP_REQUEST {
                    break;
                }
                tracing::debug!("a second stop signal right after the first: the same request");
            }
            tracing::warn!(
                "second stop signal: spawned runners get SIGKILL now, open connections are dropped"
            );
            // Every termination running (a trip's, a shutdown's) skips the rest of its grace.
            reaper.hurry();
            hurry.cancel();
        }
    });
    residency_task.abort();
    let _ = ready_tx.send(false);
    remove_discovery(&discovery);

    // 1. Stop intake; in-flight exports finish and are committed.
    collector_token.cancel();
    if !early("collector") {
        stage("collector", collector_task, &hurry).await;
    }
    // 2. Spawned runners get the normal termination sequence (attached ones are left). A
    //    second stop signal hurries the sequences (SIGKILL now, recorded as their own step),
    //    which are then waited for a little longer; what still runs after that gets the
    //    last resort below.
    let stop_all = reaper.stop_spawned_runners();
    tokio::pin!(stop_all);
    let stopped = tokio::select! {
        r = tokio::time::timeout(STAGE_DEADLINE * 3, &mut stop_all) => {
            if r.is_err() {
                tracing::warn!("stopping spawned runners passed its deadline");
            }
            r.is_ok()
        }
        () = hurry.cancelled() => tokio::time::timeout(HURRIED_STOP_WAIT, &mut stop_all)
            .await
            .is_ok(),
    };
    if !stopped {
        let n = reaper.kill_all_registered().await;
        tracing::warn!(
            signalled = n,
            "SIGKILL sent to every spawned runner still registered"
        );
    }
    // 3. Watchdog and reaper (never hurried: they persist their clock and ledger).
    let never = CancellationToken::new();
    wd_token.cancel();
    reaper_token.cancel();
    if !early("watchdog") {
        stage("watchdog", wd_task, &never).await;
    }
    if !early("reaper") {
        stage("reaper", reaper_task, &never).await;
    }
    forward_changes.abort();
    control_task.abort();
    full_task.abort();
    reserve_task.abort();
    // 4. Dashboard and webhooks.
    dash_token.cancel();
    if !early("dashboard") {
        stage("dashboard", dash_task, &hurry).await;
    }
    stage("webhooks", webhooks, &hurry).await;
    if let Some(t) = self_trace_task {
        t.abort();
    }
    // 5. The forwarder (un-acknowledged rows stay queued for the next start).
    if let Some(f) = forwarder {
        tokio::select! {
            () = f.stop(STAGE_DEADLINE) => {}
            () = hurry.cancelled() => tracing::warn!(stage = "forward", "not waited for"),
        }
    }
    hurry_task.abort();
    // 6. Storage flushes last.
    if tokio::time::timeout(STAGE_DEADLINE, storage.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("storage flush passed its deadline");
    }
    tracing::info!("stopped");
    match ended_early {
        Some((stage, why)) => Err(anyhow::anyhow!("the {stage} stopped while running: {why}")),
        None => Ok(()),
    }
}

/// How a stage's task ended before it was asked to: its panic, its error, or that it
/// returned.
fn task_end<E: std::fmt::Display>(r: Result<Result<(), E>, tokio::task::JoinError>) -> String {
    match r {
        Ok(Ok(())) => "its task returned".into(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

/// First release of the executable's code pages after the ready line, once start-up work
/// (migrations, listeners, the orphan sweep) is done.
const RELEASE_CODE_PAGES_AFTER: Duration = Duration::from_secs(10);
/// Later releases: code mapped by a burst of work does not stay mapped for good.
const RELEASE_CODE_PAGES_EVERY: Duration = Duration::from_secs(600);

/// Gives the executable's clean code pages back to the page cache
/// ([`crate::residency::release_code_pages`]) after start-up and then every
/// [`RELEASE_CODE_PAGES_EVERY`], until aborted.
async fn release_code_pages_while_running() {
    tokio::time::sleep(RELEASE_CODE_PAGES_AFTER).await;
    loop {
        match tokio::task::spawn_blocking(crate::residency::release_code_pages).await {
            Ok(Ok(bytes)) => tracing::debug!(bytes, "released the executable's code pages"),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot release the executable's code pages");
                return;
            }
            Err(_) => return,
        }
        tokio::time::sleep(RELEASE_CODE_PAGES_EVERY).await;
    }
}

/// Waits for one stage's task with the stage deadline, or until `hurry` (a second stop
/// signal) aborts it, logging what went wrong.
async fn stage<T>(name: &str, mut task: tokio::task::JoinHandle<T>, hurry: &CancellationToken) {
    tokio::select! {
        r = tokio::time::timeout(STAGE_DEADLINE, &mut task) => match r {
            Ok(Ok(_)) => tracing::debug!(stage = name, "stopped"),
            Ok(Err(e)) => tracing::error!(stage = name, "task failed: {e}"),
            Err(_) => tracing::warn!(stage = name, "did not stop within {STAGE_DEADLINE:?}"),
        },
        () = hurry.cancelled() => {
            task.abort();
            tracing::warn!(stage = name, "not waited for");
        }
    }
}

/// SIGTERM and SIGINT streams, installed before anything is bound so a stop request that
/// arrives right after the `ready` line is an ordered shutdown, never the default action.
#[cfg(unix)]
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl StopSignals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
        })
    }

    /// Resolves on SIGTERM, SIGINT, or a cancelled `shutdown` (control API).
    async fn wait(&mut self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
            _ = shutdown.cancelled() => tracing::info!("shutdown requested (control API or parent exit)"),
        }
    }
}

/// Keeps the disk-space reserve: when the disk fills while running (telemetry refused as
/// full, or a control record held, with less than the reserve free on the filesystem), frees
/// `<data_dir>/reserve` for control records and refuses telemetry; while degraded (so, after
/// a degraded start too), every 2 s, once twice the reserve is free again, re-creates it and
/// lets telemetry in again. Idle otherwise (no timer).
async fn keep_reserve(dir: std::path::PathBuf, storage: Storage, mut degraded: bool) {
    let mut full = storage.storage_full();
    let mut held = storage.held_records();
    loop {
        if degraded {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let d = dir.clone();
            let back = tokio::task::spawn_blocking(move || crate::datadir::reserve_at(&d))
                .await
                .unwrap_or(false);
            if back {
                storage.pause_ingest(None);
                tracing::info!("disk space is back: reserve re-created, telemetry accepted again");
                degraded = false;
            }
            continue;
        }
        // The disk filling while running: telemetry refused as full, or a control record
        // held. When the filesystem itself is out of space (not only the size cap), the
        // reserve goes now so the runner rows, incidents and ledger steps held in memory
        // are written (they were lost at shutdown, the reserve still in place), and
        // telemetry stays refused until the reserve can be made again.
        tokio::select! {
            r = full.changed() => if r.is_err() { return },
            r = held.changed() => if r.is_err() { return },
        }
        let d = dir.clone();
        let full = tokio::task::spawn_blocking(move || crate::datadir::disk_full_at(&d))
            .await
            .unwrap_or(false);
        if full {
            let freed = crate::datadir::release_reserve_at(&dir);
            storage.pause_ingest(Some(format!(
                "the disk is full; {}",
                crate::datadir::UNTIL_SPACE_RETURNS
            )));
            tracing::error!(
                data_dir = %dir.display(),
                reserve_freed = freed,
                "the disk is full: telemetry refused with 503, the reserve freed for control records (runners still watched and stopped)"
            );
            degraded = true;
        }
    }
}

/// Raises `storage.full` when telemetry ingest stops for lack of space, once per episode.
async fn watch_storage_full(storage: Storage, events: EventBus) {
    let mut full = storage.storage_full();
    let mut episode = 0u64;
    loop {
        let reason = full.borrow_and_update().clone();
        if let Some(reason) = reason {
            episode += 1;
            let at = now_unix_nano();
            let incident = NewIncident {
                kind: EventKind::StorageFull,
                runner_id: None,
                tool_name: None,
                trace_id: None,
                span_id: None,
                reason: format!("telemetry ingest paused: {reason}"),
                evidence: serde_json::json!({ "reason": reason }),
                idempotency_key: stallwatch_storage::keys::storage_full(at, episode),
                at_unix_nano: at,
            };
            if let Err(e) = events.publish(incident).await {
                tracing::error!("cannot record storage.full: {e}");
            }
        } else {
            events.flush_pending().await;
        }
        if full.changed().await.is_err() {
            return;
        }
    }
}

/// An address clients on this machine can dial: a wildcard listen address becomes loopback.
fn loopback_for_clients(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        let ip = if addr.is_ipv4() {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        } else {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        };
        std::net::SocketAddr::new(ip, addr.port())
    } else {
        addr
    }
}

/// Windows: Ctrl-C, Ctrl-Break, console close, logoff and system shutdown, installed
/// before anything is bound (docs/platforms.md, ordered shutdown trigger). Console close
/// leaves a process about 5 s before Windows ends it.
#[cfg(windows)]
struct StopSignals {
    c: tokio::signal::windows::CtrlC,
    brk: tokio::signal::windows::CtrlBreak,
    close: tokio::signal::windows::CtrlClose,
    logoff: tokio::signal::windows::CtrlLogoff,
    system: tokio::signal::windows::CtrlShutdown,
}

#[cfg(windows)]
impl StopSignals {
    fn install() -> Result<Self> {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close, ctrl_logoff, ctrl_shutdown};
        Ok(Self {
            c: ctrl_c().context("cannot watch Ctrl-C")?,
            brk: ctrl_break().context("cannot watch Ctrl-Break")?,
            close: ctrl_close().context("cannot watch console close")?,
            logoff: ctrl_logoff().context("cannot watch logoff")?,
            system: ctrl_shutdown().context("cannot watch system shutdown")?,
        })
    }

    /// Resolves on a console control event or a cancelled `shutdown` (control API).
    async fn wait(&mut self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = self.c.recv() => tracing::info!("Ctrl-C received"),
            _ = self.brk.recv() => tracing::info!("Ctrl-Break received"),
            _ = self.close.recv() => tracing::info!("console close received"),
            _ = self.logoff.recv() => tracing::info!("logoff received"),
            _ = self.system.recv() => tracing::info!("system shutdown received"),
            _ = shutdown.cancelled() => tracing::info!("shutdown requested (control API or parent exit)"),
        }
    }
}

/// Writes `<data_dir>/ready.json` holding exactly the ready line's JSON object, so a process
/// that only knows the data folder (`stallwatch mcp wrap`) finds the listeners: mode 0600,
/// written to a temporary file in the same folder and renamed over, so a reader never sees
/// half a file (docs/design.md, Interfaces: Files). Answers the path, removed at ordered
/// shutdown by [`remove_discovery`].
fn write_discovery(dir: &std::path::Path, ready: &str) -> Result<std::path::PathBuf> {
    use std::io::Write;
    let path = dir.join("ready.json");
    let tmp = dir.join(format!(".ready.json.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        // On Windows the file inherits the data folder's user-only ACL.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        f.write_all(ready.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Removes the discovery file at ordered shutdown; a missing file is fine.
fn remove_discovery(path: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "cannot remove the discovery file: {e}");
        }
    }
}
