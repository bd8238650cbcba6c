//! Runs `stallwatch serve` as a sidecar of the calling app: starts it with every listener
//! on `127.0.0.1:0`, reads its one `ready` line from stdout (docs/design.md, Interfaces: CLI; the
//! port discovery issue), builds a [`Client`] from it and the token file, and stops it with
//! `POST /api/v1/shutdown`, falling back to SIGKILL after a deadline.
//!
//! Dropping a [`Sidecar`] without [`Sidecar::shutdown`] kills it with SIGKILL (like a
//! crash: its spawned runners are then found by the orphan sweep on the next start). With
//! `exit_with_parent`, stallwatch also shuts down in order if the app itself dies.

use std::process::{ExitStatus, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client::Client;
use crate::config::SidecarOptions;
use crate::error::{Error, Result};
use crate::ready::ReadyLine;
use stallwatch_vocabulary::control::{TEXT_BUSY_RETRY, TEXT_BUSY_RETRY_EVERY};

/// How many stderr lines [`Error::SidecarExited`] quotes.
pub const STDERR_TAIL_LINES: usize = 20;

/// The listen address given to all three listeners: loopback, port chosen by the kernel.
pub const LOOPBACK_ANY_PORT: &str = "127.0.0.1:0";

/// A running `stallwatch serve` child and a client of it.
#[derive(Debug)]
pub struct Sidecar {
    child: Child,
    ready: ReadyLine,
    client: Client,
    options: SidecarOptions,
}

impl Sidecar {
    /// Starts `stallwatch serve` and waits for its `ready` line. Errors:
    /// [`Error::Io`] when the binary cannot be started, [`Error::SidecarExited`] when it
    /// exits first (bad config, data folder locked by another instance: see its stderr),
    /// [`Error::Timeout`] after [`SidecarOptions::ready_timeout`] (the child is killed),
    /// [`Error::BadReadyLine`], and the errors of [`Client::from_ready`].
    pub async fn spawn(options: SidecarOptions) -> Result<Sidecar> {
        let mut cmd = Command::new(&options.binary);
        cmd.arg("serve");
        if let Some(d) = &options.data_dir {
            cmd.arg("--data-dir").arg(d);
        }
        if let Some(c) = &options.config {
            cmd.arg("--config").arg(c);
        }
        cmd.args(["--otlp-grpc-listen", LOOPBACK_ANY_PORT])
            .args(["--otlp-http-listen", LOOPBACK_ANY_PORT])
            .args(["--dashboard-listen", LOOPBACK_ANY_PORT]);
        if options.exit_with_parent {
            cmd.arg("--exit-with-parent");
        }
        cmd.args(&options.extra_args)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        match &options.stderr_file {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| Error::io(format!("cannot open {}", p.display()), e))?;
                cmd.stderr(Stdio::from(f));
            }
            None => {
                cmd.stderr(Stdio::inherit());
            }
        }
        let mut child = spawn_when_not_busy(&mut cmd)
            .await
            .map_err(|e| Error::io(format!("cannot start {}", options.binary.display()), e))?;
        let Some(stdout) = child.stdout.take() else {
            return Err(Error::io(
                "stallwatch's stdout",
                std::io::Error::other("stdout was not captured"),
            ));
        };
        let mut lines = BufReader::new(stdout).lines();

        let read_ready = async {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) => match ReadyLine::parse(&line) {
                        Ok(r) => return Ok(r),
                        // Anything else on stdout before the ready line is skipped, but a
                        // malformed ready line is an error.
                        Err(e) if line.contains("\"ready\"") => return Err(Some(e)),
                        Err(_) => continue,
                    },
                    Ok(None) => return Err(None),
                    Err(e) => return Err(Some(Error::io("cannot read stallwatch's stdout", e))),
                }
            }
        };
        let outcome = tokio::time::timeout(options.ready_timeout, read_ready).await;
        let ready = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(Some(e))) => {
                let _ = child.kill().await;
                return Err(e);
            }
            Ok(Err(None)) => {
                // stdout closed: the process is exiting.
                let status = match child.wait().await {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("status unknown: {e}"),
                };
                return Err(Error::SidecarExited {
                    status,
                    stderr_tail: stderr_tail(&options),
                });
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(Error::Timeout {
                    what: format!(
                        "stallwatch printed no ready line within {} ms",
                        options.ready_timeout.as_millis()
                    ),
                });
            }
        };
        // Keep draining stdout so a later write never fails on a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let client = match Client::from_ready_with(&ready, options.client) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill().await;
                return Err(e);
            }
        };
        Ok(Sidecar {
            child,
            ready,
            client,
            options,
        })
    }

    /// Where everything listens, and the data folder.
    pub fn ready(&self) -> &ReadyLine {
        &self.ready
    }

    /// A client of this sidecar (clone it freely).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The sidecar's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `Some(status)` when the sidecar has exited (without waiting). Errors with
    /// [`Error::Io`] when its status cannot be read.
    pub fn try_exited(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(|e| Error::io("cannot read stallwatch's exit status", e))
    }

    /// Ordered shutdown: `POST /api/v1/shutdown`, then waits up to
    /// [`SidecarOptions::shutdown_deadline`] for the exit and answers its status (0 after a
    /// clean shutdown). Past the deadline it kills the process with SIGKILL, reaps it, and
    /// errors with [`Error::Timeout`]. A failed shutdown request (the process already gone)
    /// is not an error: the exit status says what happened.
    pub async fn shutdown(mut self) -> Result<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Ok(status);
        }
        let _ = self.client.shutdown().await;
        let deadline = self.options.shutdown_deadline;
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(r) => r.map_err(|e| Error::io("cannot wait for stallwatch", e)),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(Error::Timeout {
                    what: format!(
                        "stallwatch did not exit within {} ms of the shutdown request; killed with SIGKILL",
                        deadline.as_millis()
                    ),
                })
            }
        }
    }
}

/// `":\n"` and the last [`STDERR_TAIL_LINES`] lines of the stderr file, or empty.
fn stderr_tail(options: &SidecarOptions) -> String {
    let Some(p) = &options.stderr_file else {
        return String::new();
    };
    let Ok(text) = std::fs::read_to_string(p) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
    if start == lines.len() {
        return String::new();
    }
    format!(":\n{}", lines[start..].join("\n"))
}

/// Spawns `cmd`, retrying for up to [`TEXT_BUSY_RETRY`] (every [`TEXT_BUSY_RETRY_EVERY`])
/// while `execve` fails with `ETXTBSY`, the rule every spawn of an external binary
/// follows (its doc says why). Other errors are returned at once; after the window, the
/// last `ETXTBSY`.
pub async fn spawn_when_not_busy(cmd: &mut Command) -> std::io::Result<Child> {
    let deadline = tokio::time::Instant::now() + TEXT_BUSY_RETRY;
    loop {
        match cmd.spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(TEXT_BUSY_RETRY_EVERY).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn script(dir: &std::path::Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-stallwatch");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A shell line printing a ready line for `data` (ports 1, 2 and 3: nothing listens).
    fn echo_ready(data: &std::path::Path) -> String {
        format!(
            "echo '{{\"event\":\"ready\",\"otlp_grpc\":\"127.0.0.1:1\",\"otlp_http\":\"127.0.0.1:2\",\"dashboard\":\"127.0.0.1:3\",\"data_dir\":\"{}\"}}'",
            data.display()
        )
    }

    // These use small shell scripts standing in for the binary to reach failure paths the
    // real one does not take on demand; the real binary is driven in tests/client.rs.

    #[tokio::test]
    async fn exit_before_ready_quotes_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let bin = script(
            dir.path(),
            "echo 'error: data folder is locked by pid 77' >&2; exit 3",
        );
        let mut o = SidecarOptions::new(bin);
        o.stderr_file = Some(dir.path().join("stderr.log"));
        match Sidecar::spawn(o).await {
            Err(Error::SidecarExited {
                status,
                stderr_tail,
            }) => {
                assert!(status.contains('3'), "{status}");
                assert!(stderr_tail.contains("locked by pid 77"), "{stderr_tail}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A binary still open for writing (ETXTBSY) is started once the writer closes it,
    /// within the retry window; one that stays busy is an error naming it.
    #[tokio::test]
    async fn a_binary_still_open_for_writing_is_started_once_closed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("token"), "0f".repeat(32)).unwrap();
        let bin = script(dir.path(), &format!("{}\nexec sleep 30", echo_ready(&data)));
        let options = || {
            let mut o = SidecarOptions::new(bin.clone());
            o.data_dir = Some(data.clone());
            o.shutdown_deadline = Duration::from_millis(100);
            o
        };
        // Held for longer than the retry window: the error names the binary.
        let writer = std::fs::OpenOptions::new().append(true).open(&bin).unwrap();
        let started = tokio::time::Instant::now();
        match Sidecar::spawn(options()).await {
            Err(Error::Io { what, source }) => {
                assert!(what.contains("fake-stallwatch"), "{what}");
                assert_eq!(source.kind(), std::io::ErrorKind::ExecutableFileBusy);
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= TEXT_BUSY_RETRY);
        // Closed while the spawn waits: it starts.
        let spawn = tokio::spawn(Sidecar::spawn(options()));
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(writer);
        let sc = spawn.await.unwrap().unwrap();
        assert_eq!(sc.ready().dashboard, "127.0.0.1:3".parse().unwrap());
        let _ = sc.shutdown().await;
    }

    #[tokio::test]
    async fn no_ready_line_times_out_and_kills() {
        let dir = tempfile::tempdir().unwrap();
        let bin = script(dir.path(), "echo starting; exec sleep 30");
        let mut o = SidecarOptions::new(bin);
        o.ready_timeout = Duration::from_millis(300);
        assert!(matches!(
            Sidecar::spawn(o).await,
            Err(Error::Timeout { .. })
        ));
    }

    #[tokio::test]
    async fn arguments_and_ready_line_are_wired() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("token"), "0f".repeat(32)).unwrap();
        let args = dir.path().join("args");
        let bin = script(
            dir.path(),
            &format!(
                "echo \"$SW_TEST_VAR $@\" > {args}\necho not-json\n{ready}\nexec sleep 30",
                args = args.display(),
                ready = echo_ready(&data)
            ),
        );
        let mut o = SidecarOptions::new(bin);
        o.data_dir = Some(data.clone());
        o.exit_with_parent = true;
        o.extra_args = vec!["--log-format".into(), "json".into()];
        o.env = vec![("SW_TEST_VAR".into(), "env-ok".into())];
        o.shutdown_deadline = Duration::from_millis(200);
        let sc = Sidecar::spawn(o).await.unwrap();
        assert_eq!(sc.ready().dashboard, "127.0.0.1:3".parse().unwrap());
        assert_eq!(sc.client().dashboard(), sc.ready().dashboard);
        let got = std::fs::read_to_string(&args).unwrap();
        assert_eq!(
            got.trim(),
            format!(
                "env-ok serve --data-dir {} --otlp-grpc-listen 127.0.0.1:0 --otlp-http-listen 127.0.0.1:0 --dashboard-listen 127.0.0.1:0 --exit-with-parent --log-format json",
                data.display()
            )
        );
        // Nothing answers the shutdown request and `sleep` ignores it: SIGKILL fallback.
        assert!(matches!(sc.shutdown().await, Err(Error::Timeout { .. })));
    }
}
