//! The demo's reading of what happened: one timeline line per incident, and the final
//! report (termination steps, admissions, the healthy runner's spans, the board) that
//! decides the exit code.

use super::*;

impl Demo {
    pub(super) fn on_incident(&self, i: &Value, seen: &mut BTreeMap<String, Seen>) {
        let event = i["event"].as_str().unwrap_or("?");
        let runner = i["runner_id"].as_str().unwrap_or("-").to_string();
        let at: u64 = i["at_unix_nano"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(unix_nano);
        let full_reason = i["reason"].as_str().unwrap_or("");
        // The verdict and reason come first; stall forensics (why it was stuck), when
        // present after "; why: ", is printed under the event's other details.
        let (reason, why) = match full_reason.split_once("; why: ") {
            Some((r, w)) => (r, Some(w.trim())),
            None => (full_reason, None),
        };
        let s = seen.entry(runner.clone()).or_default();
        if runner == HEALTHY
            && (event.starts_with("breaker.")
                || event.starts_with("runner.terminated")
                || event == "runner.crashed"
                || event == "runner.exited"
                || event == "verdict.suspect")
        {
            s.disturbances.push(format!("{event}: {reason}"));
        }
        if event != "runner.started" {
            let line = format!("{}  {runner:<12} {event:<22} {reason}", self.stamp(at));
            println!("{}", line.trim_end());
        }
        match event {
            "breaker.opened" => {
                s.opened_reason = Some(reason.to_string());
                println!(
                    "{:>9}  {:<12} {:<22} {}",
                    "",
                    "",
                    "",
                    self.admission(&runner)
                );
            }
            "checkpoint.rolled_back" => s.rolled_back = true,
            "runner.terminated" => {
                let report = &i["evidence"]["report"];
                let steps: Vec<String> = termination_steps(report)
                    .into_iter()
                    .map(|(at, what)| {
                        format!(
                            "{what} at {}",
                            self.stamp(at).trim_start_matches('+').trim_start()
                        )
                    })
                    .collect();
                if !steps.is_empty() {
                    println!("{:>9}  {:<12} {:<22} {}", "", "", "", steps.join(", "));
                }
                if let Some(why) = why.filter(|w| !w.is_empty()) {
                    println!("{:>9}  {:<12} {:<22} why: {why}", "", "", "");
                }
                let ended_by = report["ended_by"].as_str().unwrap_or("?");
                s.terminated = Some(format!(
                    "ended by {} in {} ms",
                    if ended_by == "sigterm" {
                        "SIGTERM"
                    } else if ended_by == "sigkill" {
                        "SIGKILL"
                    } else {
                        ended_by
                    },
                    report["duration_ms"].as_u64().unwrap_or(0),
                ));
            }
            _ => {}
        }
        let _ = std::io::stdout().flush();
    }

    pub(super) fn report(
        &mut self,
        bad: &[&str],
        seen: &BTreeMap<String, Seen>,
        interrupted: &AtomicBool,
        stream_error: Option<String>,
    ) -> Result<()> {
        let mut problems = Vec::new();
        if let Some(e) = stream_error {
            problems.push(format!("incident stream: {e}"));
        }
        if interrupted.load(Ordering::SeqCst) {
            // Mid-run the staged CSV is still in the workspace and the runners still
            // hang: judging any of it would only mislead.
            println!();
            println!("interrupted (Ctrl-C): stopping the sidecar and its runners");
            bail!("the demo was interrupted before it finished");
        }
        // Final breaker state of each runner, as the watchdog sees it.
        println!();
        let board = self.board();
        let states: Vec<String> = RUNNERS
            .iter()
            .map(|(id, _, _)| format!("{id} {}", board.get(*id).map(String::as_str).unwrap_or("?")))
            .collect();
        println!("breakers:   {}", states.join(", "));

        let after = hash_tree(&self.workspace);
        let unchanged = match &after {
            Ok(after) => {
                let diff = differing(&self.before, after);
                if diff.is_empty() {
                    println!(
                        "workspace byte-for-byte as before: yes ({} files, SHA-256)",
                        after.len()
                    );
                    true
                } else {
                    println!(
                        "workspace byte-for-byte as before: NO, differing files: {}",
                        diff.join(", ")
                    );
                    false
                }
            }
            Err(e) => {
                println!("workspace byte-for-byte as before: NO, cannot hash it: {e:#}");
                false
            }
        };
        if !unchanged {
            problems.push("the workspace changed".to_string());
        }

        println!();
        println!("summary");
        for id in bad {
            let s = seen.get(*id);
            let opened = s.and_then(|s| s.opened_reason.as_deref());
            let ended = s.and_then(|s| s.terminated.as_deref());
            let mut line = match (opened, ended) {
                (Some(why), Some(end)) => format!("tripped ({}), {end}", verdict_of(why)),
                (Some(why), None) => format!("tripped ({}), NOT terminated", verdict_of(why)),
                (None, _) => "NOT tripped".to_string(),
            };
            if *id == CSV {
                let rolled = s.is_some_and(|s| s.rolled_back);
                let gone = self.staging.as_ref().is_some_and(|p| !p.exists());
                line.push_str(match (rolled, gone) {
                    (true, true) => ", checkpoint rolled back (staging folder deleted)",
                    (true, false) => {
                        ", checkpoint rolled back but its staging folder is still there"
                    }
                    _ => ", checkpoint NOT rolled back",
                });
                if rolled && !gone {
                    problems.push(format!("{id}: staging folder left behind"));
                }
                if !rolled {
                    problems.push(format!("{id}: its checkpoint was not rolled back"));
                }
            }
            if opened.is_none() || ended.is_none() {
                problems.push(format!("{id}: {line}"));
            }
            if board.get(*id).is_some_and(|b| b != "OPEN") {
                problems.push(format!(
                    "{id}: breaker {} at the end, expected OPEN",
                    board[*id]
                ));
            }
            println!("  {id:<12} {line}");
        }
        let healthy = seen
            .get(HEALTHY)
            .map(|s| s.disturbances.clone())
            .unwrap_or_default();
        let healthy_breaker = board.get(HEALTHY).map(String::as_str).unwrap_or("?");
        if healthy.is_empty() && healthy_breaker == "CLOSED" {
            println!(
                "  {HEALTHY:<12} never tripped, breaker CLOSED, {}",
                self.healthy_spans()
            );
        } else {
            println!(
                "  {HEALTHY:<12} DISTURBED (breaker {healthy_breaker}): {}",
                healthy.join("; ")
            );
            problems.push(format!(
                "{HEALTHY} was disturbed (breaker {healthy_breaker})"
            ));
        }
        println!(
            "  workspace    {}",
            if unchanged {
                "byte-for-byte as before"
            } else {
                "CHANGED"
            }
        );
        if problems.is_empty() {
            println!("result: everything happened as expected");
            Ok(())
        } else {
            println!(
                "result: NOT as expected; sidecar log: {}",
                self.log.display()
            );
            Err(anyhow!(
                "the demo did not go as expected: {}",
                problems.join("; ")
            ))
        }
    }

    /// What `GET /api/v1/runners/{id}/admit` answers now, as one phrase.
    pub(super) fn admission(&self, id: &str) -> String {
        match self.http.call(
            self.http
                .get(self.api(&format!("/api/v1/runners/{id}/admit"))),
        ) {
            Ok(r) => {
                let status = r.status.as_u16();
                let retry = r
                    .retry_after
                    .map(|v| format!(", Retry-After {v} s"))
                    .unwrap_or_default();
                let state = r.body.and_then(|v| v["state"].as_str().map(str::to_string));
                format!(
                    "admission now: {status} ({}){retry}",
                    state.as_deref().unwrap_or("?")
                )
            }
            Err(e) => format!("admission check failed: {e}"),
        }
    }

    /// "N tool spans stored" for the healthy runner (`GET /api/v1/traces?attr=...`).
    pub(super) fn healthy_spans(&self) -> String {
        let got = self.http.call(self.http.get(self.api(&format!(
            "/api/v1/traces?attr=stallwatch.runner.id={HEALTHY}&limit=1000"
        ))));
        match got.map(|r| r.body) {
            Ok(Some(v)) => {
                let n = v["items"].as_array().map_or(0, Vec::len);
                let more = if v["next_cursor"].is_string() {
                    "+"
                } else {
                    ""
                };
                format!("{n}{more} tool calls traced")
            }
            Ok(None) => "traces unavailable: the answer is not JSON".to_string(),
            Err(e) => format!("traces unavailable: {e}"),
        }
    }

    /// Breaker state per runner id from `GET /api/v1/runners`.
    pub(super) fn board(&self) -> BTreeMap<String, String> {
        let got = self.http.call(self.http.get(self.api("/api/v1/runners")));
        let mut out = BTreeMap::new();
        if let Some(v) = got.ok().and_then(|r| r.body) {
            for r in v["items"].as_array().into_iter().flatten() {
                if let (Some(id), Some(b)) = (r["id"].as_str(), r["breaker"].as_str()) {
                    out.insert(id.to_string(), b.to_string());
                }
            }
        }
        out
    }
}

/// The SIGTERM / exited / SIGKILL steps of a termination report, with wall-clock times.
pub(super) fn termination_steps(report: &Value) -> Vec<(u64, String)> {
    let sigterm_unix: u64 = report["sigterm_unix_nano"].as_u64().unwrap_or(0);
    let steps = report["steps"].as_array().cloned().unwrap_or_default();
    // Steps carry ms since the termination began; anchor them on the SIGTERM time.
    let sigterm_at_ms = steps
        .iter()
        .find(|s| s["step"] == "sigterm_sent")
        .and_then(|s| s["at_ms"].as_u64())
        .unwrap_or(0);
    let began = sigterm_unix.saturating_sub(sigterm_at_ms * 1_000_000);
    let mut out = Vec::new();
    for s in &steps {
        let at_ms = s["at_ms"].as_u64().unwrap_or(0);
        let label = match s["step"].as_str().unwrap_or("") {
            "sigterm_sent" => "SIGTERM".to_string(),
            "exited" => "exited".to_string(),
            "sigkill_sent" => "SIGKILL".to_string(),
            "reaped" => match exit_text(&s["detail"]["exit"]) {
                Some(e) => format!("reaped ({e})"),
                None => "reaped".to_string(),
            },
            _ => continue,
        };
        out.push((began + at_ms * 1_000_000, label));
    }
    out
}

/// "killed by SIGTERM" / "exit code 0" from an exit JSON, when it says.
pub(super) fn exit_text(exit: &Value) -> Option<String> {
    if let Some(sig) = exit["signal"].as_i64() {
        let name = match sig {
            15 => "SIGTERM".to_string(),
            9 => "SIGKILL".to_string(),
            n => format!("signal {n}"),
        };
        return Some(format!("killed by {name}"));
    }
    exit["code"].as_i64().map(|c| format!("exit code {c}"))
}

/// "tool_overrun" out of "tool_overrun: tool span ...".
pub(super) fn verdict_of(reason: &str) -> &str {
    reason.split(':').next().unwrap_or(reason).trim()
}
