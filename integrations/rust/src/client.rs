//! The typed client of stallwatch's dashboard listener: the control endpoints (bearer token;
//! docs/design.md, Control endpoints), admission, the read API and the live event stream.
//!
//! Every call has a deadline ([`ClientOptions::request_timeout`]) except the event stream.
//! The token is sent on every request (read endpoints ignore it). Errors are mapped by
//! [`crate::error::error_from_answer`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Url};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::ClientOptions;
use crate::error::{error_from_answer, Error, Result};
use crate::process::process_start_time_ticks;
use crate::ready::ReadyLine;
use crate::sse::{EventFollower, EventStream};
use crate::types::{
    valid_runner_id, Admission, Checkpoint, CheckpointOutcome, Incident, IncidentQuery, Page,
    Runner, RunnerSpec,
};

/// Length of the control-API token in hex characters (docs/design.md, Interfaces: Files).
pub const TOKEN_HEX_LEN: usize = 64;

/// Delay before [`Client::events_from`] reconnects when the server gave no `retry:`: 1 s.
pub const DEFAULT_EVENTS_RETRY: Duration = Duration::from_secs(1);

/// Longest delay between reconnection attempts of [`Client::events_from`] (the delay
/// doubles after each failed attempt): 30 s.
pub const MAX_EVENTS_RETRY: Duration = Duration::from_secs(30);

/// Reads a token file: 64 hex characters, surrounding whitespace ignored. Errors with
/// [`Error::Io`] when unreadable, [`Error::BadToken`] when malformed.
pub fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("cannot read token {}", path.display()), e))?;
    let token = text.trim();
    if token.len() != TOKEN_HEX_LEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::BadToken(path.to_path_buf()));
    }
    Ok(token.to_string())
}

/// A client of one stallwatch. Cheap to clone (the connection pool is shared).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    dashboard: SocketAddr,
    token: String,
    options: ClientOptions,
}

impl Client {
    /// A client of the dashboard at `dashboard` (e.g. `127.0.0.1:4319`) with bearer `token`
    /// and default timeouts. Errors with [`Error::Transport`] when the HTTP stack cannot be
    /// built.
    pub fn new(dashboard: SocketAddr, token: impl Into<String>) -> Result<Client> {
        Self::with_options(dashboard, token, ClientOptions::default())
    }

    /// Like [`Client::new`] with explicit timeouts.
    pub fn with_options(
        dashboard: SocketAddr,
        token: impl Into<String>,
        options: ClientOptions,
    ) -> Result<Client> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(options.connect_timeout)
            .build()
            .map_err(Error::Transport)?;
        let base = Url::parse(&format!("http://{dashboard}/"))
            .map_err(|e| Error::decode("dashboard address", e))?;
        Ok(Client {
            http,
            base,
            dashboard,
            token: token.into(),
            options,
        })
    }

    /// A client from a parsed ready line: the dashboard address, and the token read from
    /// `<data_dir>/token` (see [`read_token`]).
    pub fn from_ready(ready: &ReadyLine) -> Result<Client> {
        Self::from_ready_with(ready, ClientOptions::default())
    }

    /// Like [`Client::from_ready`] with explicit timeouts.
    pub fn from_ready_with(ready: &ReadyLine, options: ClientOptions) -> Result<Client> {
        let token = read_token(&ready.token_path())?;
        Self::with_options(ready.dashboard, token, options)
    }

    /// The dashboard address this client talks to.
    pub fn dashboard(&self) -> SocketAddr {
        self.dashboard
    }

    /// `http://<dashboard>/`: the web UI, for a Tauri window or a browser.
    pub fn dashboard_url(&self) -> String {
        self.base.to_string()
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        self.http
            .request(method, self.url(segments))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
    }

    /// Sends with the call deadline; answers (status, body) for 2xx, the mapped error
    /// otherwise.
    async fn call(&self, req: RequestBuilder, runner: Option<&str>, what: &str) -> Result<String> {
        let (status, _, body) = self.raw(req, what).await?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(error_from_answer(status, &body, runner))
        }
    }

    async fn raw(&self, req: RequestBuilder, what: &str) -> Result<(u16, Option<u64>, String)> {
        let resp = req
            .timeout(self.options.request_timeout)
            .send()
            .await
            .map_err(|e| Error::from_reqwest(e, what))?;
        let status = resp.status().as_u16();
        let retry_after_s = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = resp
            .text()
            .await
            .map_err(|e| Error::from_reqwest(e, what))?;
        Ok((status, retry_after_s, body))
    }

    async fn call_json<T: DeserializeOwned>(
        &self,
        req: RequestBuilder,
        runner: Option<&str>,
        what: &str,
    ) -> Result<T> {
        let body = self.call(req, runner, what).await?;
        serde_json::from_str(&body).map_err(|e| Error::decode(what, e))
    }

    fn check_id(id: &str) -> Result<()> {
        if valid_runner_id(id) {
            Ok(())
        } else {
            Err(Error::InvalidRunnerId(id.to_string()))
        }
    }

    /// `POST /api/v1/runners` (token): registers a runner to spawn or attach. Answers the
    /// reaper's JSON reply. Errors: [`Error::Conflict`] when the same id is alive (a dead one
    /// is replaced), [`Error::Http`] 400 for an invalid spec, [`Error::InvalidRunnerId`]
    /// before sending for a bad id.
    pub async fn register_runner(&self, spec: &RunnerSpec) -> Result<serde_json::Value> {
        Self::check_id(&spec.id)?;
        let req = self
            .request(Method::POST, &["api", "v1", "runners"])
            .json(spec);
        self.call_json(req, None, "register runner answer").await
    }

    /// Registers process `pid` (started by the caller) as runner `id`, reading its start
    /// time from `/proc/PID/stat` so stallwatch can prove the pid was not recycled before
    /// signalling it. `heartbeat_socket` is the UNIX socket it serves `PING`/`PONG` on.
    /// Errors as [`Client::register_runner`], plus [`Error::Io`] when the process is gone.
    pub async fn attach_runner(
        &self,
        id: &str,
        pid: u32,
        heartbeat_socket: Option<&Path>,
    ) -> Result<serde_json::Value> {
        let ticks = process_start_time_ticks(pid)?;
        let mut spec = RunnerSpec::attached(id, pid, Some(ticks));
        spec.heartbeat_socket = heartbeat_socket.map(PathBuf::from);
        self.register_runner(&spec).await
    }

    /// `DELETE /api/v1/runners/{id}` (token): answers when termination is done, with its
    /// steps and survivors (the termination report, as JSON). Errors:
    /// [`Error::UnknownRunner`].
    pub async fn delete_runner(&self, id: &str) -> Result<serde_json::Value> {
        Self::check_id(id)?;
        let req = self.request(Method::DELETE, &["api", "v1", "runners", id]);
        self.call_json(req, Some(id), "termination report").await
    }

    /// `GET /api/v1/runners/{id}/admit`: ask before dispatching an MCP request to runner
    /// `id`. 200 → `admit = true` (CLOSED); 503 → `admit = false` with the state, reason and
    /// `retry_after_ms` (from the body, else from `Retry-After`). Errors:
    /// [`Error::UnknownRunner`] (404), [`Error::Http`] 503 when stallwatch is shutting down.
    pub async fn admit(&self, id: &str) -> Result<Admission> {
        Self::check_id(id)?;
        let req = self.request(Method::GET, &["api", "v1", "runners", id, "admit"]);
        let (status, retry_after_s, body) = self.raw(req, "admission").await?;
        match status {
            200 => serde_json::from_str(&body).map_err(|e| Error::decode("admission", e)),
            503 => match serde_json::from_str::<Admission>(&body) {
                Ok(mut a) => {
                    if a.retry_after_ms.is_none() {
                        a.retry_after_ms = Some(retry_after_s.unwrap_or(1).max(1) * 1000);
                    }
                    Ok(a)
                }
                Err(_) => Err(error_from_answer(status, &body, Some(id))),
            },
            _ => Err(error_from_answer(status, &body, Some(id))),
        }
    }

    /// `POST /api/v1/runners/{id}/breaker/reset` (token): closes the runner's breaker.
    /// Errors: [`Error::UnknownRunner`].
    pub async fn reset_breaker(&self, id: &str) -> Result<serde_json::Value> {
        Self::check_id(id)?;
        let req = self.request(
            Method::POST,
            &["api", "v1", "runners", id, "breaker", "reset"],
        );
        self.call_json(req, Some(id), "breaker reset answer").await
    }

    /// `POST /api/v1/checkpoints` (token): opens a checkpoint for `runner_id` in
    /// `workspace` (an absolute path). Answers its id and staging folder
    /// (`<workspace>/.workbench/checkpoints/<id>/`); the tool writes there. Errors:
    /// [`Error::Http`] 400 for a relative or escaping workspace.
    pub async fn create_checkpoint(&self, runner_id: &str, workspace: &Path) -> Result<Checkpoint> {
        Self::check_id(runner_id)?;
        let req = self
            .request(Method::POST, &["api", "v1", "checkpoints"])
            .json(&json!({"runner_id": runner_id, "workspace": workspace}));
        self.call_json(req, None, "checkpoint").await
    }

    /// `POST /api/v1/checkpoints/{id}/commit` (token): validates, fsyncs and renames each
    /// staged file into the workspace (journaled, so a crash midway rolls forward).
    pub async fn commit_checkpoint(&self, id: &str) -> Result<CheckpointOutcome> {
        let req = self.request(Method::POST, &["api", "v1", "checkpoints", id, "commit"]);
        self.call_json(req, None, "checkpoint commit answer").await
    }

    /// `POST /api/v1/checkpoints/{id}/rollback` (token): deletes the staging folder; the
    /// workspace stays at its last stable state.
    pub async fn rollback_checkpoint(&self, id: &str) -> Result<CheckpointOutcome> {
        let req = self.request(Method::POST, &["api", "v1", "checkpoints", id, "rollback"]);
        self.call_json(req, None, "checkpoint rollback answer")
            .await
    }

    /// `GET /api/v1/runners`: every runner as the watchdog sees it, ordered by id.
    pub async fn runners(&self) -> Result<Vec<Runner>> {
        let req = self.request(Method::GET, &["api", "v1", "runners"]);
        let page: Page<Runner> = self.call_json(req, None, "runner list").await?;
        Ok(page.items)
    }

    /// `GET /api/v1/runners/{id}`: one runner. Errors: [`Error::UnknownRunner`].
    pub async fn runner(&self, id: &str) -> Result<Runner> {
        Self::check_id(id)?;
        let req = self.request(Method::GET, &["api", "v1", "runners", id]);
        self.call_json(req, Some(id), "runner").await
    }

    /// `GET /api/v1/incidents`: one page of incidents, newest first.
    pub async fn incidents(&self, query: &IncidentQuery) -> Result<Page<Incident>> {
        let req = self
            .request(Method::GET, &["api", "v1", "incidents"])
            .query(&query.pairs());
        self.call_json(req, None, "incident list").await
    }

    /// `GET /api/v1/traces/{trace_id}` (lowercase hex): `{"trace_id","spans","logs"}` as
    /// JSON (docs/design.md, Read API JSON). Errors: [`Error::Http`] 404 when unknown.
    pub async fn trace(&self, trace_id: &str) -> Result<serde_json::Value> {
        let req = self.request(Method::GET, &["api", "v1", "traces", trace_id]);
        self.call_json(req, None, "trace").await
    }

    /// `POST /api/v1/shutdown` (token): starts stallwatch's ordered shutdown (spawned
    /// runners are stopped; attached ones are left alone). Answers once accepted, not when
    /// the process has exited.
    pub async fn shutdown(&self) -> Result<()> {
        let req = self.request(Method::POST, &["api", "v1", "shutdown"]);
        self.call(req, None, "shutdown").await.map(|_| ())
    }

    /// `GET /api/v1/events`: one connection to the live event stream. With
    /// `last_event_id`, the server first replays the incidents after that id
    /// (`Last-Event-ID`). The stream ends when the connection does; see
    /// [`Client::events_from`] to follow across reconnections.
    pub async fn events(&self, last_event_id: Option<i64>) -> Result<EventStream> {
        let mut req = self
            .request(Method::GET, &["api", "v1", "events"])
            .header(ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Error::from_reqwest(e, "event stream"))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let body = resp.text().await.unwrap_or_default();
            return Err(error_from_answer(status, &body, None));
        }
        Ok(EventStream::new(Box::pin(resp.bytes_stream())))
    }

    /// Follows the event stream forever from `last_event_id`: reconnects after the
    /// connection ends or fails, resuming with `Last-Event-ID` = the last id seen, after the
    /// server's `retry:` delay (else [`DEFAULT_EVENTS_RETRY`], doubling after each failed
    /// attempt up to [`MAX_EVENTS_RETRY`]). Connection errors are yielded (the caller may
    /// stop); [`Error::Unauthorized`] ends the stream. Drop the stream to stop following.
    pub fn events_from(&self, last_event_id: Option<i64>) -> EventFollower {
        struct St {
            client: Client,
            last: Option<i64>,
            conn: Option<EventStream>,
            delay: Option<Duration>,
            failures: u32,
            done: bool,
        }
        let st = St {
            client: self.clone(),
            last: last_event_id,
            conn: None,
            delay: None,
            failures: 0,
            done: false,
        };
        EventFollower::new(Box::pin(futures::stream::unfold(st, |mut st| async move {
            loop {
                if st.done {
                    return None;
                }
                if let Some(d) = st.delay.take() {
                    tokio::time::sleep(d).await;
                }
                let conn = match st.conn.as_mut() {
                    Some(c) => c,
                    None => match st.client.events(st.last).await {
                        Ok(c) => st.conn.insert(c),
                        Err(e) => {
                            st.done = matches!(e, Error::Unauthorized);
                            st.failures = st.failures.saturating_add(1);
                            st.delay = Some(backoff(None, st.failures));
                            return Some((Err(e), st));
                        }
                    },
                };
                match conn.next().await {
                    Some(Ok(ev)) => {
                        st.failures = 0;
                        st.last = ev.id.or(st.last);
                        return Some((Ok(ev), st));
                    }
                    Some(Err(e)) => {
                        let failed_io = matches!(e, Error::Transport(_) | Error::Timeout { .. });
                        if failed_io {
                            let retry = conn.retry();
                            st.conn = None;
                            st.failures = st.failures.saturating_add(1);
                            st.delay = Some(backoff(retry, st.failures));
                        }
                        return Some((Err(e), st));
                    }
                    None => {
                        let retry = conn.retry();
                        st.conn = None;
                        st.delay = Some(backoff(retry, st.failures));
                    }
                }
            }
        })))
    }
}

/// Reconnection delay: the server's `retry:` (else [`DEFAULT_EVENTS_RETRY`]), doubled per
/// consecutive failure beyond the first, capped at [`MAX_EVENTS_RETRY`].
fn backoff(server: Option<Duration>, failures: u32) -> Duration {
    let base = server.unwrap_or(DEFAULT_EVENTS_RETRY);
    let factor = 1u32 << failures.saturating_sub(1).min(6);
    base.saturating_mul(factor).min(MAX_EVENTS_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_and_is_capped() {
        assert_eq!(backoff(None, 0), Duration::from_secs(1));
        assert_eq!(backoff(None, 1), Duration::from_secs(1));
        assert_eq!(backoff(None, 2), Duration::from_secs(2));
        assert_eq!(backoff(None, 3), Duration::from_secs(4));
        assert_eq!(backoff(None, 50), MAX_EVENTS_RETRY);
        assert_eq!(
            backoff(Some(Duration::from_millis(200)), 2),
            Duration::from_millis(400)
        );
    }

    #[test]
    fn token_file_must_be_64_hex() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        assert_eq!(read_token(&p).unwrap(), "ab".repeat(32));
        std::fs::write(&p, "xyz").unwrap();
        assert!(matches!(read_token(&p), Err(Error::BadToken(_))));
        assert!(matches!(
            read_token(&dir.path().join("missing")),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn urls_encode_path_segments() {
        let c = Client::new("127.0.0.1:9".parse().unwrap(), "t").unwrap();
        assert_eq!(
            c.url(&["api", "v1", "checkpoints", "a b/c", "commit"])
                .as_str(),
            "http://127.0.0.1:9/api/v1/checkpoints/a%20b%2Fc/commit"
        );
        assert_eq!(c.dashboard_url(), "http://127.0.0.1:9/");
    }

    #[tokio::test]
    async fn bad_runner_ids_are_refused_before_sending() {
        // Port 9 (discard) on loopback: nothing listens, so a sent request would be a
        // Transport error, not InvalidRunnerId.
        let c = Client::new("127.0.0.1:9".parse().unwrap(), "t").unwrap();
        assert!(matches!(
            c.admit("Bad/Id").await,
            Err(Error::InvalidRunnerId(_))
        ));
        assert!(matches!(c.admit("ok").await, Err(Error::Transport(_))));
    }
}
