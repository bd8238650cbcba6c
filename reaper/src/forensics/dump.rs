//! Taking a kit's stacks: asking a Node kit `STACKS` on its heartbeat socket, else SIGUSR2
//! through the runner's pidfd (only when the stacks file's header names its pid), then
//! polling the dump file until the kit has written it (issue 18; `docs/design.md`, Stall
//! forensics).

use super::*;

impl Forensics {
    /// Takes the kit's stacks: from a Node kit that offers `main_stack=heartbeat`, by asking
    /// `STACKS` on its heartbeat socket (no signal at all); else (or when that answer is an
    /// error) by SIGUSR2, sent only when the header names the pid, then waits for the dump.
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
}

/// A parsed dump.
pub(super) struct Dump {
    pub(super) runtime: Runtime,
    pub(super) threads: Vec<ThreadStack>,
    pub(super) active_handles: Vec<(String, usize)>,
    pub(super) source: PathBuf,
    /// Why the Node kit's `STACKS` answer is missing, when it is.
    pub(super) heartbeat_note: Option<String>,
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
