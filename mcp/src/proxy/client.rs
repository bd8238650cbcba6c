//! Requests from the client: each one opens its MCP span (MCP semantic conventions), a
//! `tools/call` is admitted or refused by the breaker, and in-flight requests are answered
//! in the server's place when it is tripped or dies.

use super::*;

impl Relay {
    pub(super) async fn on_client(&mut self, line: Vec<u8>) {
        if let Some(items) = jsonrpc::parse_batch(&line) {
            self.on_client_batch(line, items).await;
            return;
        }
        let Some(msg) = jsonrpc::parse(&line) else {
            self.send_to_server(line);
            return;
        };
        match jsonrpc::kind(&msg) {
            Kind::Request { id, method } => match self.on_request(&msg, id, method, None).await {
                Some(refusal) => self.to_client(refusal.to_string().into_bytes()),
                None => self.send_to_server(line),
            },
            Kind::Notification { method } => {
                self.on_notification(&msg, &method, &line).await;
                self.send_to_server(line);
            }
            Kind::Response { .. } | Kind::Other => self.send_to_server(line),
        }
    }

    /// A JSON-RPC batch from the client (JSON-RPC 2.0 §6; MCP 2025-03-26 allows them):
    /// each request in it is tracked as if it came alone, so one in flight when the server
    /// dies is answered too. The batch goes to the server as it came, unless a `tools/call`
    /// in it is refused by the open breaker: the refusals are answered at once in their own
    /// batch, and the rest goes on without them.
    async fn on_client_batch(&mut self, line: Vec<u8>, items: Vec<Value>) {
        self.batch_seq += 1;
        let batch = self.batch_seq;
        let mut forward = Vec::with_capacity(items.len());
        let mut refused = Vec::new();
        for item in items {
            match jsonrpc::kind(&item) {
                Kind::Request { id, method } => {
                    match self.on_request(&item, id, method, Some(batch)).await {
                        Some(refusal) => refused.push(refusal),
                        None => forward.push(item),
                    }
                }
                Kind::Notification { method } => {
                    let one = item.to_string().into_bytes();
                    self.on_notification(&item, &method, &one).await;
                    forward.push(item);
                }
                Kind::Response { .. } | Kind::Other => forward.push(item),
            }
        }
        if refused.is_empty() {
            self.send_to_server(line);
            return;
        }
        if !forward.is_empty() {
            self.send_to_server(Value::Array(forward).to_string().into_bytes());
        }
        self.to_client(Value::Array(refused).to_string().into_bytes());
    }

    /// A request from the client, alone or in batch `batch`: opens its span and tracks it
    /// as in flight, or, for a `tools/call` the open breaker refuses, ends the span and
    /// gives back the refusal to answer ([`TRIPPED_ERROR_CODE`]) instead.
    async fn on_request(
        &mut self,
        msg: &Value,
        id: String,
        method: String,
        batch: Option<u64>,
    ) -> Option<Value> {
        if method == "initialize" {
            self.init_request = Some(msg.clone());
            if !self.session_ready {
                self.health_mut(|h| h.init_sent = Some(Instant::now()));
            }
        }
        let params = msg.get("params");
        let refuse = method == "tools/call"
            && matches!(self.breaker, Breaker::Open { .. })
            && !self.admitted_now().await;
        let mut span = self.start_span(&method, params, &msg["id"]);
        if refuse {
            if let Breaker::Open {
                verdict, reason, ..
            } = self.breaker.clone()
            {
                let retry_after_ms = self.retry_after_ms();
                let message = format!(
                    "stallwatch refused the call: the breaker of MCP server runner {} is open ({}); retry after {retry_after_ms} ms",
                    self.cfg.runner_id,
                    verdict_and_reason(&verdict, &reason)
                );
                let refusal = jsonrpc::error_value(
                    &msg["id"],
                    TRIPPED_ERROR_CODE,
                    &message,
                    json!({"runner_id": self.cfg.runner_id, "verdict": verdict, "retry_after_ms": retry_after_ms}),
                );
                span.end(Some(("breaker_open", message)));
                let r = self.resource();
                self.exporter.send(&r, &span).await;
                return Some(refusal);
            }
        }
        if method == "tools/call" {
            let r = self.resource();
            self.exporter.send(&r, &span).await;
        }
        let progress_token = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("progressToken"))
            .map(jsonrpc::id_key);
        self.answered.remove(&id);
        self.inflight.insert(
            id,
            InFlight {
                id: msg["id"].clone(),
                method,
                span,
                progress_token,
                batch,
            },
        );
        None
    }

    /// A notification from the client (`line`: its own text): `initialized` is kept for
    /// the replay after a restart and makes the session ready; `cancelled` ends the span of
    /// the request it names.
    async fn on_notification(&mut self, msg: &Value, method: &str, line: &[u8]) {
        match method {
            "notifications/initialized" => {
                self.initialized_note = Some(line.to_vec());
                self.mark_session_ready();
            }
            "notifications/cancelled" => {
                let key = msg
                    .get("params")
                    .and_then(|p| p.get("requestId"))
                    .map(jsonrpc::id_key);
                if let Some(mut f) = key.and_then(|k| self.inflight.remove(&k)) {
                    let why = msg["params"]["reason"]
                        .as_str()
                        .unwrap_or("cancelled by the client")
                        .to_string();
                    f.span.end(Some(("cancelled", why)));
                    let r = self.resource();
                    self.exporter.send(&r, &f.span).await;
                }
            }
            _ => {}
        }
    }

    /// While the breaker was last heard OPEN or HALF_OPEN, asks admission now
    /// (`GET /api/v1/runners/{id}/admit`); true when it says CLOSED (the breaker closed
    /// since). Without an answer within [`ADMIT_DEADLINE`] the call is refused.
    pub(super) async fn admitted_now(&mut self) -> bool {
        let Some(s) = &self.sidecar else {
            return false;
        };
        let answer =
            tokio::time::timeout(ADMIT_DEADLINE, s.client.admit(&self.cfg.runner_id)).await;
        match answer {
            Ok(Ok(a)) if a.admit => {
                self.on_news(BreakerNews::Closed).await;
                true
            }
            Ok(Ok(a)) => {
                if let Breaker::Open {
                    retry_after_ms,
                    heard,
                    ..
                } = &mut self.breaker
                {
                    *retry_after_ms = a.retry_after_ms.unwrap_or(0);
                    *heard = Instant::now();
                }
                false
            }
            _ => false,
        }
    }

    pub(super) fn mark_session_ready(&mut self) {
        self.session_ready = true;
        self.health_mut(|h| {
            h.ready = true;
            h.last_answer = Some(Instant::now());
            h.init_sent = None;
        });
    }

    pub(super) fn start_span(&self, method: &str, params: Option<&Value>, id: &Value) -> McpSpan {
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        let target = match method {
            "tools/call" | "prompts/get" => name,
            _ => None,
        };
        let mut span = McpSpan::start(method, target, params);
        span.set_str("mcp.method.name", method);
        span.set_str(
            "jsonrpc.request.id",
            match id {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        );
        span.set_str("mcp.session.id", &self.session_id);
        if let Some(v) = &self.protocol_version {
            span.set_str("mcp.protocol.version", v);
        }
        span.set_str("network.transport", "pipe");
        match method {
            "tools/call" => {
                span.set_str("gen_ai.operation.name", "execute_tool");
                if let Some(tool) = name {
                    span.set_str("gen_ai.tool.name", tool);
                    if let Some(sla) = self.slas.get(tool) {
                        span.set_int("stallwatch.sla_ms", *sla);
                    }
                }
            }
            "prompts/get" => {
                if let Some(p) = name {
                    span.set_str("gen_ai.prompt.name", p);
                }
            }
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                if let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
                    span.set_str("mcp.resource.uri", uri);
                }
            }
            _ => {}
        }
        span
    }

    pub(super) fn retry_after_ms(&self) -> u64 {
        match &self.breaker {
            Breaker::Open {
                retry_after_ms,
                heard,
                ..
            } => retry_after_ms.saturating_sub(heard.elapsed().as_millis() as u64),
            Breaker::Closed => 0,
        }
    }

    /// Answers every in-flight request with [`TRIPPED_ERROR_CODE`]. Tool spans are ended
    /// here only when `end_tool_spans` (a crash); after a trip stallwatch writes their ends
    /// itself (`error.type = timeout`).
    pub(super) async fn fail_inflight(
        &mut self,
        verdict: &str,
        reason: &str,
        end_tool_spans: bool,
    ) {
        let retry_after_ms = self.retry_after_ms();
        let message = format!(
            "stallwatch stopped MCP server runner {}: {}",
            self.cfg.runner_id,
            verdict_and_reason(verdict, reason)
        );
        let data = json!({
            "runner_id": self.cfg.runner_id,
            "verdict": verdict,
            "retry_after_ms": retry_after_ms,
        });
        let resource = self.resource();
        let mut drained: Vec<(String, InFlight)> = self.inflight.drain().collect();
        drained.sort_by_key(|(_, f)| f.span.start_unix_nano);
        // A request held for the next incarnation (sent while the server was exiting or
        // being restarted) is answered here in the server's place: it must not also reach
        // the new server, or a client that retries after this answer runs it twice. From a
        // held batch only such requests are taken out; its notifications still go.
        let drained_ids: HashSet<String> = drained.iter().map(|(k, _)| k.clone()).collect();
        let mut never_sent = HashSet::new();
        let held = std::mem::take(&mut self.held);
        for line in held {
            if let Some(items) = jsonrpc::parse_batch(&line) {
                let before = items.len();
                let rest: Vec<Value> = items
                    .into_iter()
                    .filter(|item| match jsonrpc::kind(item) {
                        Kind::Request { id, .. } if drained_ids.contains(&id) => {
                            never_sent.insert(id);
                            false
                        }
                        _ => true,
                    })
                    .collect();
                if rest.len() == before {
                    self.held.push_back(line);
                } else if !rest.is_empty() {
                    self.held
                        .push_back(Value::Array(rest).to_string().into_bytes());
                }
                continue;
            }
            match jsonrpc::parse(&line).map(|m| jsonrpc::kind(&m)) {
                Some(Kind::Request { id, .. }) if drained_ids.contains(&id) => {
                    never_sent.insert(id);
                }
                _ => self.held.push_back(line),
            }
        }
        // Requests that came in one batch are answered in one batch (JSON-RPC 2.0 §6).
        let mut batches: Vec<(u64, Vec<Value>)> = Vec::new();
        for (key, mut f) in drained {
            let answer = jsonrpc::error_value(&f.id, TRIPPED_ERROR_CODE, &message, data.clone());
            match f.batch {
                Some(b) => match batches.iter_mut().find(|(x, _)| *x == b) {
                    Some((_, answers)) => answers.push(answer),
                    None => batches.push((b, vec![answer])),
                },
                None => self.to_client(answer.to_string().into_bytes()),
            }
            // a late answer from the server is dropped (a held request never reached one)
            if !never_sent.contains(&key) {
                self.answered.insert(key);
            }
            if f.method != "tools/call" || end_tool_spans {
                let ty = if verdict == "crashed" {
                    "crashed"
                } else {
                    "timeout"
                };
                f.span.end(Some((ty, message.clone())));
                self.exporter.send(&resource, &f.span).await;
            }
        }
        for (_, answers) in batches {
            self.to_client(Value::Array(answers).to_string().into_bytes());
        }
    }
}
