//! Taking a kit's stacks: asking the kit `STACKS` on its heartbeat socket (a Node kit's
//! `main_stack=heartbeat`, a Python kit's `threads=heartbeat`), else SIGUSR2 through the
//! runner's pidfd (only when the stacks file's header names its pid), then polling the dump
//! file until the kit has written it (issue 18; `docs/design.md`, Stall forensics).

use super::*;

impl Forensics {
    /// Takes the kit's stacks: from a Node kit that offers `main_stack=heartbeat`, by asking
    /// `STACKS` on its heartbeat socket (no signal at all); from a Python kit that offers
    /// `threads=heartbeat`, by asking `STACKS` for at most [`python_stacks_window`] of the
    /// budget; else (or when that answer is missing or an error) by SIGUSR2, sent only when
    /// the header names the pid, then waits for the dump.
    pub(super) async fn dump(
        &self,
        s: &Subject,
        deadline: tokio::time::Instant,
    ) -> Result<Dump, String> {
        if !s.spawned {
            return Err(format!(
                "attached runner: stallwatch gave it no {STACKS_FILE_ENV}, so no dump was asked for"
            ));
        }
        let file = stacks_path(&self.data_dir, &s.runner_id, &s.instance_id);
        let header = stacks::read_header(&file, s.pid)?;
        let mut heartbeat_note = None;
        match (header.runtime, &s.heartbeat_socket) {
            (Runtime::Node, Some(sock)) if header.main_stack => {
                match tokio::time::timeout_at(deadline, ask_stacks(sock)).await {
                    Ok(Ok(answer)) => match stacks::parse_heartbeat_stacks(&answer) {
                        Ok(hb) => return Ok(node_dump(hb, &file)),
                        Err(why) => heartbeat_note = Some(why),
                    },
                    Ok(Err(why)) => heartbeat_note = Some(why),
                    Err(_) => {
                        return Err(format!(
                            "the node kit did not answer STACKS on its heartbeat socket within the {} ms budget",
                            self.budget.as_millis()
                        ))
                    }
                }
            }
            (Runtime::Python, Some(sock)) if header.threads => {
                // Every thread, read under the interpreter's lock, and no signal at all.
                // No answer means the GIL is held (a C call): then SIGUSR2, whose dump of
                // the main thread faulthandler makes without the GIL.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let window = python_stacks_window(self.budget, left);
                let until = tokio::time::Instant::now() + window;
                match tokio::time::timeout_at(until, ask_stacks(sock)).await {
                    Ok(Ok(answer)) => match stacks::parse_python_heartbeat_stacks(&answer) {
                        Ok(threads) => {
                            return Ok(Dump {
                                runtime: Runtime::Python,
                                threads,
                                active_handles: Vec::new(),
                                source: file,
                                heartbeat_note: None,
                                taken_by: TakenBy::Heartbeat,
                            })
                        }
                        Err(why) => heartbeat_note = Some(why),
                    },
                    Ok(Err(why)) => heartbeat_note = Some(why),
                    Err(_) => {
                        heartbeat_note = Some(format!(
                            "the python kit did not answer STACKS within {} ms (a C call holding the GIL its heartbeat thread needs?): the main thread's stack alone, from faulthandler",
                            window.as_millis()
                        ))
                    }
                }
            }
            _ => {}
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
                                heartbeat_note,
                                taken_by: TakenBy::Signal,
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
                                    taken_by: TakenBy::Signal,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A parsed dump.
pub(super) struct Dump {
    pub(super) runtime: Runtime,
    pub(super) threads: Vec<ThreadStack>,
    pub(super) active_handles: Vec<(String, usize)>,
    pub(super) source: PathBuf,
    /// Why the kit's `STACKS` answer is missing, when it is (Node: the main thread's
    /// stack; Python: every thread but the main one).
    pub(super) heartbeat_note: Option<String>,
    /// How the stacks were taken.
    pub(super) taken_by: TakenBy,
}

/// How a dump was taken (`evidence.stacks.taken_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum TakenBy {
    /// The kit's answer to `STACKS` on its heartbeat socket: no signal was sent.
    Heartbeat,
    /// SIGUSR2 and the kit's dump file (Python `faulthandler`, Node `process.report`).
    Signal,
}

/// How long stallwatch waits for a Python kit's `STACKS` answer before it sends SIGUSR2
/// instead: two fifths of the budget (200 ms of the default 500), at most half of what is
/// `left`, so the signal's dump keeps the rest. A heartbeat thread answers within a few ms
/// unless a C call holds the GIL; then no wait would be long enough.
pub(super) fn python_stacks_window(budget: Duration, left: Duration) -> Duration {
    (budget * 2 / 5).min(left / 2)
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
        taken_by: TakenBy::Heartbeat,
    }
}

/// Asks the kit `STACKS` on its heartbeat socket; returns its answer line (at most
/// [`stacks::MAX_HEARTBEAT_ANSWER_BYTES`]). The caller bounds the time.
async fn ask_stacks(sock: &Path) -> Result<String, String> {
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
    Ok(String::from_utf8_lossy(&buf).into_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_python_stacks_window_leaves_the_signal_most_of_the_budget() {
        let ms = Duration::from_millis;
        assert_eq!(python_stacks_window(ms(500), ms(480)), ms(200));
        assert_eq!(python_stacks_window(ms(300), ms(280)), ms(120));
        // Little left: at most half of it, so the dump keeps the other half.
        assert_eq!(python_stacks_window(ms(500), ms(100)), ms(50));
        assert_eq!(python_stacks_window(ms(500), ms(0)), ms(0));
    }
}
