//! Orphan sweep after a simulated crash (C31): rows left active by a previous run are
//! re-adopted only when pid + start time + boot id match; otherwise marked orphaned with a
//! reason, checkpoints rolled back, never signalled. A half-done termination is finished.

use std::time::Duration;

use stallwatch_reaper::platform;
use stallwatch_storage::checkpoints::{CheckpointRow, CheckpointState};
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::runners::{ActionRecord, RunnerRow, RunnerRowState};
use stallwatch_storage::{IncidentQuery, Storage, StorageConfig};

use crate::common::*;

fn row(id: &str, pid: u32, start: u64, state: RunnerRowState) -> RunnerRow {
    RunnerRow {
        id: id.into(),
        spawned: true,
        spec: serde_json::to_value(spawn_spec(id, &["sleep", "30"])).unwrap(),
        pid: Some(pid),
        start_time_ticks: Some(start),
        boot_id: Some(platform::boot_id().unwrap()),
        pgid: Some(pid),
        instance_id: Some(format!("old-{id}")),
        heartbeat_socket: None,
        state,
        detail: serde_json::json!({}),
        registered_unix_nano: 1,
        updated_unix_nano: 1,
    }
}

#[tokio::test]
async fn sweep_orphans_dead_and_recycled_runners_adopts_live_ones_and_never_signals() {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("keep.txt"), "stable").unwrap();
    // A process that is gone.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let dead_start = platform::proc_stat(dead_pid)
        .map(|s| s.start_time_ticks)
        .unwrap_or(1);
    dead.wait().unwrap();
    // A live process whose start time does not match (a recycled pid).
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let other_pid = other.id();
    let other_start = platform::proc_stat(other_pid).unwrap().start_time_ticks;
    // A live process that is the recorded one, mid-termination (SIGTERM done, no SIGKILL).
    let mut alive = std::process::Command::new("sh")
        .args(["-c", "trap '' TERM; sleep 30"])
        .spawn()
        .unwrap();
    let alive_pid = alive.id();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let alive_start = platform::proc_stat(alive_pid).unwrap().start_time_ticks;
    {
        let s = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
        s.upsert_runner(row("gone", dead_pid, dead_start, RunnerRowState::Running))
            .await
            .unwrap();
        s.upsert_runner(row(
            "recycled",
            other_pid,
            other_start + 3,
            RunnerRowState::Running,
        ))
        .await
        .unwrap();
        s.upsert_runner(row(
            "halfdone",
            alive_pid,
            alive_start,
            RunnerRowState::Stopping,
        ))
        .await
        .unwrap();
        for (step, phase) in [
            ("descendants_recorded", "done"),
            ("sigterm_sent", "intent"),
            ("sigterm_sent", "done"),
        ] {
            s.record_action(ActionRecord {
                runner_id: "halfdone".into(),
                termination_id: "t-old".into(),
                step: step.into(),
                phase: phase.into(),
                pid: Some(alive_pid),
                detail: serde_json::json!({}),
                at_unix_nano: now_unix_nano(),
            })
            .await
            .unwrap();
        }
        let staging = ws.path().join(".workbench/checkpoints/cp-old");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(staging.join("keep.txt"), "half-written").unwrap();
        s.create_checkpoint(CheckpointRow {
            id: "cp-old".into(),
            runner_id: "recycled".into(),
            workspace: ws.path().as_os_str().as_encoded_bytes().to_vec(),
            staging: staging.as_os_str().as_encoded_bytes().to_vec(),
            state: CheckpointState::Open,
            detail: serde_json::json!({}),
            created_unix_nano: 1,
            updated_unix_nano: 1,
        })
        .await
        .unwrap();
        s.shutdown().await;
    }
    let cfg = config(dir.path(), 300);
    let mut h = harness_with(dir, cfg).await;
    let mut orphaned = Vec::new();
    while orphaned.len() < 2 {
        let i = tokio::time::timeout(Duration::from_secs(30), h.incidents.recv())
            .await
            .unwrap()
            .unwrap();
        if i.incident.kind == EventKind::RunnerOrphaned {
            assert_eq!(i.incident.evidence["orphaned"], true);
            orphaned.push((
                i.incident.runner_id.clone().unwrap(),
                i.incident.reason.clone(),
            ));
        }
    }
    orphaned.sort();
    assert_eq!(orphaned[0].0, "gone");
    assert!(orphaned[0].1.contains("gone"), "{:?}", orphaned[0]);
    assert_eq!(orphaned[1].0, "recycled");
    assert!(
        orphaned[1].1.contains("another process"),
        "{:?}",
        orphaned[1]
    );
    // Never signalled: the process holding the recycled pid is alive.
    assert!(running(other_pid));
    // Its checkpoint is rolled back; the workspace is as it was.
    let cp = h
        .storage
        .checkpoint("cp-old".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cp.state, CheckpointState::RolledBack);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("keep.txt")).unwrap(),
        "stable"
    );
    assert!(!ws.path().join(".workbench/checkpoints/cp-old").exists());
    for id in ["gone", "recycled"] {
        let r = h.storage.runner_row(id.into()).await.unwrap().unwrap();
        assert_eq!(r.state, RunnerRowState::Orphaned);
    }
    // The half-done termination is finished without repeating SIGTERM: straight to SIGKILL.
    let t = h.incident(EventKind::RunnerTerminated, "halfdone").await;
    assert_eq!(t.incident.evidence["report"]["ended_by"], "sigkill");
    assert_eq!(t.incident.evidence["report"]["termination_id"], "t-old");
    wait_for("half-done runner gone", || !running(alive_pid)).await;
    let actions = h
        .storage
        .runner_actions("halfdone".into(), 100)
        .await
        .unwrap();
    let sigterms = actions
        .iter()
        .filter(|a| a.step == "sigterm_sent" && a.phase == "done")
        .count();
    assert_eq!(sigterms, 1, "a finished SIGTERM is never repeated");
    assert!(actions.iter().any(|a| a.step == "finished"));
    let incidents = h
        .storage
        .incidents(IncidentQuery {
            kind: Some(EventKind::RunnerOrphaned),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(incidents.len(), 2);
    other.kill().unwrap();
    let _ = other.wait();
    let _ = alive.wait();
}

/// An orphaned runner's open tool span (in the watchdog's durable open-span ledger) gets its
/// end written as an error with `error.type = "orphaned"`, and leaves the ledger.
#[tokio::test]
async fn sweep_closes_open_spans_of_an_orphan_as_errors() {
    use stallwatch_storage::ledger::{LedgerRow, LedgerWrite};
    use stallwatch_storage::model::*;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let (t, s) = (TraceId([3; 16]), SpanId([4; 8]));
    {
        let st = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
        st.upsert_runner(row("lost", dead_pid, 12345, RunnerRowState::Running))
            .await
            .unwrap();
        let span = Span {
            trace_id: t,
            span_id: s,
            name: "execute_tool fit".into(),
            start_time_unix_nano: now_unix_nano() - 1_000_000_000,
            ..Default::default()
        };
        st.write_traces(Arc::new(TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource: Resource::default(),
                scope_spans: vec![ScopeSpans {
                    scope: Scope::default(),
                    spans: vec![span],
                }],
            }],
        }))
        .await
        .unwrap();
        st.ledger_apply(std::sync::Arc::new(vec![LedgerWrite::Upsert(Box::new(
            LedgerRow {
                trace_id: t,
                span_id: s,
                parent_span_id: None,
                name: "execute_tool fit".into(),
                tool_name: Some("fit".into()),
                runner_id: Some("lost".into()),
                service_name: "svc".into(),
                pid: Some(dead_pid),
                state: SpanState::Open,
                boot_id: platform::boot_id().unwrap(),
                first_seen_mono_ns: 1,
                last_seen_mono_ns: 1,
                refreshes: 0,
                first_seen_unix_nano: 1,
                last_seen_unix_nano: 1,
                sla_ms: Some(1000),
                sla_override_ms: None,
            },
        ))]))
        .await
        .unwrap();
        st.shutdown().await;
    }
    let cfg = config(dir.path(), 300);
    let mut h = harness_with(dir, cfg).await;
    let i = h.incident(EventKind::RunnerOrphaned, "lost").await;
    assert_eq!(i.incident.evidence["spans_closed"], 1);
    let sp = h.storage.span(t, s).await.unwrap().unwrap().span;
    assert_eq!(sp.status.code, STATUS_ERROR);
    assert_eq!(
        attr(&sp.attributes, "error.type").and_then(AnyValue::as_str),
        Some("orphaned")
    );
    assert!(sp.events.iter().any(|e| e.name == "orphaned"));
    let left = h
        .storage
        .open_spans(stallwatch_storage::ledger::OpenSpanQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(left.items.is_empty(), "{left:?}");
}
