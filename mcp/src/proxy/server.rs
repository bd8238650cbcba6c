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
            tokio::spawn(write_lines(stdin, stdin_rx));
        }
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_lines(stdout, self.events.clone(), Some(generation)));
        }
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let events = self.events.clone();
        tokio::spawn(async move {
            let status = tokio::select! {
                s = child.wait() => s,
                _ = kill_rx => {
                    // Last resort without a sidecar: SIGKILL the direct child (std's own
                    // call); with a sidecar the reaper terminates the whole group.
                    let _ = child.start_kill();
                    child.wait().await
                }
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
            tokio::spawn(async move {
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
    /// SIGTERM to its group, grace, SIGKILL), else SIGKILL to the direct child.
    pub(super) async fn terminate_server(&mut self) {
        let Some(server) = self.server.as_mut() else {
            return;
        };
        if let Some(s) = &self.sidecar {
            if s.client.delete_runner(&self.cfg.runner_id).await.is_ok() {
                return;
            }
        }
        if let Some(k) = server.kill.take() {
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
