//! The pipes and signals around the relay: line readers and writers for both pipes (one
//! task each, so a stuck peer never blocks the other side), the exit code of the server,
//! and the SIGTERM / SIGINT / SIGHUP listener.

use super::*;

/// Reads newline-delimited lines (without the `\n`) and sends them as events; EOF is
/// [`Ev::ClientEof`] on the client side, [`Ev::ServerEof`] on the server's.
pub(super) async fn read_lines<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    events: mpsc::UnboundedSender<Ev>,
    generation: Option<u64>,
) {
    let mut r = BufReader::with_capacity(64 * 1024, r);
    loop {
        let mut line = Vec::new();
        match r.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                if line.is_empty() {
                    continue;
                }
                let ev = match generation {
                    Some(generation) => Ev::Server { generation, line },
                    None => Ev::Client(line),
                };
                if events.send(ev).is_err() {
                    return;
                }
            }
        }
    }
    let _ = events.send(match generation {
        Some(generation) => Ev::ServerEof { generation },
        None => Ev::ClientEof,
    });
}

/// Writes each line plus `\n`, flushing when the queue is momentarily empty.
pub(super) async fn write_lines<W: tokio::io::AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut w = tokio::io::BufWriter::new(w);
    while let Some(line) = rx.recv().await {
        if w.write_all(&line).await.is_err() || w.write_all(b"\n").await.is_err() {
            return;
        }
        if rx.is_empty() && w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.flush().await;
}

/// The wrapper's own exit code for the server's status, and how it ended: the server's
/// code, or `128 + signal` for a signalled server (the shell convention).
#[cfg(unix)]
pub(super) fn exit_code_of(s: std::process::ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => (c, format!("exit status {c}")),
        (None, Some(sig)) => (128 + sig, format!("killed by signal {sig}")),
        _ => (1, "unknown exit".to_string()),
    }
}

/// The wrapper's own exit code for the server's status: Windows always has an exit code.
#[cfg(windows)]
pub(super) fn exit_code_of(s: std::process::ExitStatus) -> (i32, String) {
    match s.code() {
        Some(c) => (c, format!("exit status {c}")),
        None => (1, "unknown exit".to_string()),
    }
}

/// Ctrl-C, Ctrl-Break and console close on Windows: the wrapper's stop requests there.
#[cfg(windows)]
pub(super) struct Signals {
    c: tokio::signal::windows::CtrlC,
    brk: tokio::signal::windows::CtrlBreak,
    close: tokio::signal::windows::CtrlClose,
}

#[cfg(windows)]
impl Signals {
    pub(super) fn install() -> Result<Self, Error> {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
        let io = |source| Error::Io {
            what: "cannot watch console control events".into(),
            source,
        };
        Ok(Self {
            c: ctrl_c().map_err(io)?,
            brk: ctrl_break().map_err(io)?,
            close: ctrl_close().map_err(io)?,
        })
    }

    pub(super) async fn recv(&mut self) {
        tokio::select! {
            _ = self.c.recv() => {}
            _ = self.brk.recv() => {}
            _ = self.close.recv() => {}
        }
    }
}

#[cfg(unix)]
pub(super) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    pub(super) fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let io = |source| Error::Io {
            what: "cannot watch stop signals".into(),
            source,
        };
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(io)?,
            int: signal(SignalKind::interrupt()).map_err(io)?,
            hup: signal(SignalKind::hangup()).map_err(io)?,
        })
    }

    pub(super) async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}
