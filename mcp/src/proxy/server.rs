//! The server process, one incarnation after another: spawn it in its own process group,
//! register it with the sidecar, feed its stdin, stop it, and decide after its exit whether
//! the restart policy starts it again.

use super::*;

impl Relay {
    /// Starts a new incarnation of the server: own process group, piped stdin/stdout,
    /// stderr passed through; registers it with the sidecar in the background. A server
    /// binary still open for writing is retried ([`stallwatch_client::spawn_when_not_busy`]).
    pub(super) async fn spawn_server(&mut self, register_now: bool) -> Result<(), Error> {
        let mut cmd = tokio::process::Command::new(&self.cfg.argv[0]);
        cmd.args(&self.cfg.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // No STALLWATCH_RUNNER_ID here: the reaper hunts processes carrying it as
            // escaped descendants, and would take the next incarnation for one.
            .kill_on_drop(true);
        // Its own process group, so the reaper's group signal (on Windows its CTRL_BREAK
        // to the console group) reaches the server and not the wrapper.
        #[cfg(unix)]
        cmd.process_group(0);
        #[cfg(windows)]
        cmd.creation_flags(windows_sys::Win32::System::Threading::CREATE_NEW_PROCESS_GROUP);
        let mut child = stallwatch_client::spawn_when_not_busy(&mut cmd)
            .await
            .map_err(|source| Error::Spawn {
                program: self.cfg.argv[0].clone(),
                source,
            })?;
        self.generation += 1;
        let generation = self.generation;
        let pid = child.id().unwrap_or(0);
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        if let Some(stdin) = child.stdin.take() {
            stallwatch_vocabulary::task::spawn_boxed(write_lines(stdin, stdin_rx));
        }
        if let Some(stdout) = child.stdout.take() {
            stallwatch_vocabulary::task::spawn_boxed(read_lines(
                stdout,
                self.events.clone(),
                Some(generation),
            ));
        }
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let events = self.events.clone();
        stallwatch_vocabulary::task::spawn_boxed(async move {
            let status = tokio::select! {
                s = child.wait() => s,
                _ = kill_rx => stop_child(&mut child, pid).await,
            };
            let (code, how) = match status {
                Ok(s) => exit_code_of(s),
                Err(e) => (1, format!("wait failed: {e}")),
            };
            let _ = events.send(Ev::ServerExit {
                generation,
                code,
                how,
            });
        });
        self.server = Some(Server {
            pid,
            stdin: Some(stdin_tx),
            kill: Some(kill_tx),
        });
        self.pings.clear();
        self.health_mut(|h| {
            h.ready = false;
            h.last_answer = None;
            h.init_sent = None;
        });
        if register_now {
            self.register(pid);
        } else {
            self.unregistered = Some(pid);
        }
        Ok(())
    }

    /// Registers `pid` with the sidecar in the background (no-op without one).
    pub(super) fn register(&self, pid: u32) {
        if let (Some(s), Some(sock)) = (self.sidecar.clone(), self.socket.clone()) {
            let id = self.cfg.runner_id.clone();
            stallwatch_vocabulary::task::spawn_boxed(async move {
                if let Err(e) = sidecar::register(&s, &id, pid, &sock).await {
                    eprintln!("stallwatch mcp: cannot register the server (pid {pid}) as runner {id}: {e}");
                }
            });
        }
    }

    pub(super) fn send_to_server(&mut self, line: Vec<u8>) {
        if self.replaying.is_some() || self.exited.is_some() {
            self.held.push_back(line);
            return;
        }
        if let Some(tx) = self.server.as_ref().and_then(|s| s.stdin.as_ref()) {
            let _ = tx.send(line);
        }
    }

    pub(super) fn write_server_now(&self, line: Vec<u8>) {
        if let Some(tx) = self.server.as_ref().and_then(|s| s.stdin.as_ref()) {
            let _ = tx.send(line);
        }
    }

    /// The client closed its stdin or the wrapper was told to stop: close the server's
    /// stdin (MCP spec, Lifecycle: Shutdown) and say `BYE` on the heartbeat socket.
    pub(super) fn begin_stop(&mut self) {
        self.stopping = true;
        self.health_mut(|h| h.bye = true);
        if let Some(s) = self.server.as_mut() {
            s.stdin = None;
        }
    }

    /// Has the server terminated: through the sidecar (`DELETE /api/v1/runners/{id}`:
    /// SIGTERM to its group, grace, SIGKILL) when this incarnation is registered with it,
    /// else by the wrapper itself ([`Relay::kill_server`]). An incarnation not registered yet
    /// (a restart waiting for its replayed `initialize`) is never left to the sidecar, whose
    /// registration still names the previous, dead one.
    pub(super) async fn terminate_server(&mut self) {
        let Some(server) = self.server.as_ref() else {
            return;
        };
        let registered = self.unregistered != Some(server.pid);
        if let (Some(s), true) = (&self.sidecar, registered) {
            if s.client.delete_runner(&self.cfg.runner_id).await.is_ok() {
                return;
            }
        }
        self.kill_server();
    }

    /// Stops the current incarnation itself: SIGTERM to its process group, [`KILL_GRACE`],
    /// SIGKILL to the group (on Windows the direct child is killed).
    pub(super) fn kill_server(&mut self) {
        if let Some(k) = self.server.as_mut().and_then(|s| s.kill.take()) {
            let _ = k.send(());
        }
    }

    /// A server exit that no trip explained within [`EXIT_EXPLAIN_WAIT`] (or that a trip
    /// explains): answer what was in flight, then restart under the policy.
    pub(super) async fn after_exit(&mut self) -> Result<(), Error> {
        let Some((_, code, how)) = self.exited.take() else {
            return Ok(());
        };
        let (verdict, reason) = match &self.breaker {
            Breaker::Open {
                verdict, reason, ..
            } => (verdict.clone(), reason.clone()),
            Breaker::Closed => (
                "crashed".to_string(),
                format!("the MCP server exited ({how})"),
            ),
        };
        self.fail_inflight(&verdict, &reason, matches!(self.breaker, Breaker::Closed))
            .await;
        let now = Instant::now();
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.cfg.restart_window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= self.cfg.max_restarts {
            eprintln!(
                "stallwatch mcp: the MCP server exited ({how}, code {code}) after {} restarts within {} s; giving up",
                self.restarts.len(),
                self.cfg.restart_window.as_secs()
            );
            return Err(Error::GaveUp {
                restarts: self.restarts.len(),
                window_s: self.cfg.restart_window.as_secs(),
                code,
            });
        }
        self.restarts.push_back(now);
        eprintln!("stallwatch mcp: the MCP server exited ({how}); restarting it");
        // A restarted server is registered once it has answered the replayed `initialize`:
        // the sidecar's HALF_OPEN probe then finds it able to answer ping.
        self.spawn_server(self.init_request.is_none()).await?;
        if let Some(init) = &self.init_request {
            let mut init = init.clone();
            let id = format!("stallwatch-init-{}", self.generation);
            init["id"] = Value::from(id.clone());
            self.replaying = Some(jsonrpc::id_key(&Value::from(id)));
            self.replay_sent = Some(Instant::now());
            self.health_mut(|h| h.init_sent = Some(Instant::now()));
            self.write_server_now(init.to_string().into_bytes());
        } else {
            self.flush_held();
        }
        Ok(())
    }

    pub(super) fn flush_held(&mut self) {
        while let Some(line) = self.held.pop_front() {
            self.write_server_now(line);
        }
    }
}

/// The wrapper's own stop of its child `pid` (no sidecar, or an incarnation the sidecar does
/// not know): SIGTERM to the process group the child leads (spawned with
/// `process_group(0)`, so its pgid is its pid, which stays reserved while the child is
/// unreaped), up to [`KILL_GRACE`] for it to exit, then SIGKILL to the group. The group is
/// signalled only while the child is not yet reaped. Windows: the direct child is killed.
///
/// The one signal sent outside `reaper/src/platform.rs` (ARCHITECTURE.md, Invariants): the
/// target is proven by construction, the wrapper's own child, not yet waited for.
#[allow(clippy::disallowed_methods)]
async fn stop_child(
    child: &mut tokio::process::Child,
    pid: u32,
) -> std::io::Result<std::process::ExitStatus> {
    #[cfg(unix)]
    {
        use rustix::process::{kill_process_group, Pid, Signal};
        let group = i32::try_from(pid).ok().and_then(Pid::from_raw);
        if let Some(g) = group {
            let _ = kill_process_group(g, Signal::TERM);
            if let Ok(status) = tokio::time::timeout(KILL_GRACE, child.wait()).await {
                return status;
            }
            let _ = kill_process_group(g, Signal::KILL);
            return child.wait().await;
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
    let _ = child.start_kill();
    child.wait().await
}
