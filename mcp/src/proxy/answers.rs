//! Lines from the server: answers end their request's span, the wrapper's own `ping` and
//! replayed `initialize` answers are kept from the client, and the tool list's SLAs are
//! read; the ping tick sends the heartbeat pings.

use super::*;

impl Relay {
    pub(super) async fn on_server(&mut self, line: Vec<u8>) {
        if let Some(items) = jsonrpc::parse_batch(&line) {
            self.on_server_batch(line, items).await;
            return;
        }
        let Some(msg) = jsonrpc::parse(&line) else {
            self.to_client(line);
            return;
        };
        match jsonrpc::kind(&msg) {
            Kind::Response { id } => {
                if self.on_response(&msg, id).await {
                    self.to_client(line);
                }
            }
            Kind::Notification { method } if method == "notifications/progress" => {
                self.on_progress(&msg).await;
                self.to_client(line);
            }
            _ => self.to_client(line),
        }
    }

    /// A batch from the server (the answers to a client's batch, JSON-RPC 2.0 §6): each
    /// answer ends its request's span like a lone one. It reaches the client as it came,
    /// or without the answers the client must not see (to the wrapper's own requests, or to
    /// requests already answered in the server's place), or not at all when none is left.
    async fn on_server_batch(&mut self, line: Vec<u8>, items: Vec<Value>) {
        let before = items.len();
        let mut keep = Vec::with_capacity(before);
        for item in items {
            match jsonrpc::kind(&item) {
                Kind::Response { id } => {
                    if self.on_response(&item, id).await {
                        keep.push(item);
                    }
                }
                Kind::Notification { method } if method == "notifications/progress" => {
                    self.on_progress(&item).await;
                    keep.push(item);
                }
                _ => keep.push(item),
            }
        }
        if keep.len() == before {
            self.to_client(line);
        } else if !keep.is_empty() {
            self.to_client(Value::Array(keep).to_string().into_bytes());
        }
    }

    /// An answer from the server: true when it goes on to the client. An answer to a
    /// wrapper ping or to the replayed `initialize` is the wrapper's own, one to a request
    /// already answered in the server's place is dropped; any other ends its request's span.
    async fn on_response(&mut self, msg: &Value, id: String) -> bool {
        if let Some(pos) = self.pings.iter().position(|(k, _)| *k == id) {
            self.pings.remove(pos);
            self.health_mut(|h| h.last_answer = Some(Instant::now()));
            return false;
        }
        if id.starts_with(&format!("\"{}", self.ping_prefix())) {
            // one of this wrapper's pings, too old to be remembered: never the
            // client's (its id carries this run's random part)
            return false;
        }
        if self.replaying.as_deref() == Some(id.as_str()) {
            self.replaying = None;
            self.replay_sent = None;
            self.read_initialize_result(msg);
            if let Some(note) = self.initialized_note.clone() {
                self.write_server_now(note);
            }
            self.mark_session_ready();
            self.flush_held();
            if let Some(pid) = self.unregistered.take() {
                self.register(pid);
            }
            return false;
        }
        if self.answered.remove(&id) {
            return false;
        }
        if let Some(mut f) = self.inflight.remove(&id) {
            match f.method.as_str() {
                "initialize" => self.read_initialize_result(msg),
                "tools/list" => self.read_tool_slas(msg),
                _ => {
                    if !self.session_ready && self.init_request.is_none() {
                        // A session that started without `initialize`.
                        self.mark_session_ready();
                    }
                }
            }
            let err = if let Some(e) = msg.get("error") {
                let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
                f.span.set_str("rpc.response.status_code", code.to_string());
                let m = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                Some((code.to_string(), m))
            } else if msg["result"]["isError"] == Value::Bool(true) {
                Some((
                    "tool_error".to_string(),
                    "the tool reported an error".into(),
                ))
            } else {
                None
            };
            f.span
                .end(err.as_ref().map(|(t, m)| (t.as_str(), m.clone())));
            let r = self.resource();
            self.exporter.send(&r, &f.span).await;
        }
        true
    }

    /// `notifications/progress` from the server: refreshes the span of the request whose
    /// progress token it names (the watchdog sees the tool is alive; its SLA is unchanged).
    async fn on_progress(&mut self, msg: &Value) {
        let token = msg
            .get("params")
            .and_then(|p| p.get("progressToken"))
            .map(jsonrpc::id_key);
        if let Some(t) = token {
            let span = self
                .inflight
                .values()
                .find(|f| f.progress_token.as_deref() == Some(t.as_str()))
                .map(|f| f.span.clone());
            if let Some(span) = span {
                let r = self.resource();
                self.exporter.send(&r, &span).await;
            }
        }
    }

    pub(super) fn read_initialize_result(&mut self, msg: &Value) {
        let result = &msg["result"];
        if let Some(n) = result["serverInfo"]["name"].as_str() {
            self.server_name = Some(n.to_string());
        }
        if let Some(v) = result["protocolVersion"].as_str() {
            self.protocol_version = Some(v.to_string());
        }
    }

    /// Reads `_meta["dev.stallwatch/sla_ms"]` of each tool in a `tools/list` result (a
    /// positive integer, ms); other values are ignored.
    pub(super) fn read_tool_slas(&mut self, msg: &Value) {
        let Some(tools) = msg["result"]["tools"].as_array() else {
            return;
        };
        for t in tools {
            let (Some(name), Some(sla)) = (
                t["name"].as_str(),
                t["_meta"][SLA_META_KEY].as_i64().filter(|v| *v > 0),
            ) else {
                continue;
            };
            self.slas.insert(name.to_string(), sla);
        }
    }

    /// The start of this wrapper run's ping ids: `stallwatch-ping-<8 hex digits>-`.
    pub(super) fn ping_prefix(&self) -> String {
        format!("stallwatch-ping-{}-", &self.session_id[..8])
    }

    pub(super) fn on_ping_tick(&mut self) {
        if let Some(sent) = self.replay_sent {
            if sent.elapsed() >= self.cfg.initialize_timeout && !self.stopping {
                // The restarted server never answered the replayed `initialize`: it is not
                // registered yet, so nothing else watches it. Stop it; its exit answers
                // what is held and goes through the restart policy.
                eprintln!(
                    "stallwatch mcp: the restarted MCP server did not answer the replayed initialize within {} ms; stopping it",
                    self.cfg.initialize_timeout.as_millis()
                );
                self.replay_sent = None;
                self.kill_server();
            }
            return;
        }
        if !self.session_ready || self.replaying.is_some() || self.server.is_none() {
            return;
        }
        self.ping_seq += 1;
        let id = format!("{}{}", self.ping_prefix(), self.ping_seq);
        let key = jsonrpc::id_key(&Value::from(id.clone()));
        self.pings.push_back((key, Instant::now()));
        while self.pings.len() > MAX_PINGS {
            self.pings.pop_front();
        }
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string();
        self.write_server_now(line.into_bytes());
    }
}
