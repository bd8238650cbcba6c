//! Turning what forensics read into an incident's evidence: the classification sentence,
//! threads, stacks with the tool's own frame marked, CPU figures from the sampler's
//! history, bounded to [`MAX_EVIDENCE_BYTES`]; and the follow-up update of the incident
//! (issue 18; `docs/design.md`, Stall forensics).

use super::dump::Dump;
use super::*;

impl Forensics {
    pub(super) fn assemble(
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
            history: hist.reach(&sample),
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
                let mut v = json!({
                    "runtime": d.runtime, "source": d.source, "threads": d.threads,
                    "tool_frame": tool_frame, "active_handles": d.active_handles.iter().map(|(t, n)| json!({"type": t, "count": n})).collect::<Vec<_>>(),
                    "note": note, "taken_by": d.taken_by,
                });
                if let Some(why) = d.heartbeat_note {
                    let key = match d.runtime {
                        Runtime::Node => "main_stack_unavailable",
                        Runtime::Python => "threads_unavailable",
                    };
                    v[key] = json!(why);
                }
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

/// The tool name and span start of the incident `id` (trip or suspect).
pub(super) async fn tool_context(storage: &Storage, id: i64) -> ToolContext {
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
pub(super) async fn attach(storage: &Storage, id: i64, ev: &Evidence) {
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
}
