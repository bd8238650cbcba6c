//! One OTLP export to the upstream, over gRPC (tonic client) or HTTP/protobuf (reqwest),
//! classified by the OTLP exporter spec ("Retrying", "Failures"): success (with the
//! count `partial_success` rejected), retryable (with the server's delay hint: HTTP
//! `Retry-After` seconds, gRPC `google.rpc.RetryInfo`), or a permanent refusal.

use std::io::Write as _;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use stallwatch_collector::rpc::{RetryInfo, RpcStatus, RETRY_INFO_TYPE};
use stallwatch_storage::forward::Signal;
use stallwatch_vocabulary::redact::redact_url;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::Channel;
use tonic::Code;

use super::config::{Compression, ForwardConfig, Protocol};
use super::error::ForwardError;

/// One export request, ready to send (and to re-send on retry).
#[derive(Clone, Debug)]
pub enum Request {
    /// Spans.
    Traces(ExportTraceServiceRequest),
    /// Log records.
    Logs(ExportLogsServiceRequest),
    /// Metric points.
    Metrics(ExportMetricsServiceRequest),
}

impl Request {
    fn signal(&self) -> Signal {
        match self {
            Request::Traces(_) => Signal::Traces,
            Request::Logs(_) => Signal::Logs,
            Request::Metrics(_) => Signal::Metrics,
        }
    }

    fn encode(&self) -> Vec<u8> {
        match self {
            Request::Traces(r) => r.encode_to_vec(),
            Request::Logs(r) => r.encode_to_vec(),
            Request::Metrics(r) => r.encode_to_vec(),
        }
    }
}

/// What the upstream answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Acknowledged; `rejected` items were refused inside it (`partial_success`).
    Accepted {
        /// Items the upstream rejected.
        rejected: u64,
        /// Its `error_message` (may be empty).
        message: String,
    },
    /// Try again later (after `hint` when the server gave one).
    Retry {
        /// The connection was reset or closed mid-request: some servers refuse an
        /// over-size body that way (closing before reading it), so a smaller request may
        /// pass where the same one keeps failing.
        cut_off: bool,
        /// The server's delay.
        hint: Option<Duration>,
        /// What happened.
        error: String,
    },
    /// Refused for good: the items are dropped, unless `too_large` and a smaller request
    /// can be tried.
    Refused {
        /// The upstream said the request is too large (HTTP 413, gRPC
        /// `RESOURCE_EXHAUSTED` without RetryInfo).
        too_large: bool,
        /// What happened.
        error: String,
    },
}

/// A client for the configured upstream.
pub struct Exporter {
    protocol: Protocol,
    /// Where each signal goes (traces, logs, metrics): the URL (HTTP) or the origin (gRPC).
    urls: [String; 3],
    /// The same URLs as errors name them (a password replaced by `***`, `redact_url`).
    shown: [String; 3],
    headers: Vec<(String, String)>,
    compression: Compression,
    timeout: Duration,
    http: reqwest::Client,
    /// One channel per signal (clones share one connection when the origins are equal).
    grpc: Option<[Channel; 3]>,
}

/// The extra CA certificates of `ca_file`, as PEM bytes.
fn read_ca(config: &ForwardConfig) -> Result<Option<Vec<u8>>, ForwardError> {
    let Some(path) = &config.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| ForwardError::Config {
        key: "ca_file",
        message: format!("cannot read {}: {e}", path.display()),
    })?;
    Ok(Some(pem))
}

impl Exporter {
    /// Builds the client; gRPC connects lazily (and reconnects) on first use.
    ///
    /// Errors: [`ForwardError::Client`] when reqwest cannot build its client,
    /// [`ForwardError::Config`] (`endpoint`) when tonic refuses the URL.
    pub fn new(config: &ForwardConfig) -> Result<Self, ForwardError> {
        let ca = read_ca(config)?;
        let mut http = reqwest::Client::builder()
            .use_rustls_tls()
            .no_proxy()
            .redirect(same_origin_redirects())
            .timeout(config.timeout)
            .connect_timeout(config.timeout);
        if let Some(pem) = &ca {
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(|e| ForwardError::Config {
                    key: "ca_file",
                    message: format!("not a PEM certificate bundle: {e}"),
                })?;
            if certs.is_empty() {
                return Err(ForwardError::Config {
                    key: "ca_file",
                    message: "holds no PEM certificate".into(),
                });
            }
            for c in certs {
                http = http.add_root_certificate(c);
            }
        }
        let http = http
            .build()
            .map_err(|e| ForwardError::Client(e.to_string()))?;
        let urls = [Signal::Traces, Signal::Logs, Signal::Metrics].map(|s| config.url(s));
        let grpc = match config.protocol {
            Protocol::Grpc => {
                let mut channels = Vec::with_capacity(3);
                for (i, url) in urls.iter().enumerate() {
                    if let Some(j) = urls[..i].iter().position(|u| u == url) {
                        let same: &Channel = &channels[j];
                        channels.push(same.clone());
                        continue;
                    }
                    channels.push(grpc_channel(url, config.timeout, ca.as_deref())?);
                }
                let [t, l, m]: [Channel; 3] = channels
                    .try_into()
                    .map_err(|_| ForwardError::Client("three gRPC channels expected".into()))?;
                Some([t, l, m])
            }
            Protocol::HttpProtobuf => None,
        };
        let shown = urls.clone().map(|u| redact_url(&u));
        Ok(Self {
            protocol: config.protocol,
            urls,
            shown,
            headers: config.headers.clone(),
            compression: config.compression,
            timeout: config.timeout,
            http,
            grpc,
        })
    }

    /// Sends one request and classifies the answer. Never panics on a bad answer.
    pub async fn export(&self, req: &Request) -> Outcome {
        match (&self.grpc, self.protocol) {
            (Some(ch), Protocol::Grpc) => {
                let ch = ch[req.signal().index()].clone();
                self.export_grpc(ch, req.clone()).await
            }
            _ => self.export_http(req).await,
        }
    }

    async fn export_http(&self, req: &Request) -> Outcome {
        let signal = req.signal();
        let url = &self.urls[signal.index()];
        let shown = &self.shown[signal.index()];
        let mut body = req.encode();
        let mut builder = self
            .http
            .post(url)
            .header("content-type", "application/x-protobuf");
        if self.compression == Compression::Gzip {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 4),
                flate2::Compression::fast(),
            );
            if enc.write_all(&body).is_ok() {
                if let Ok(z) = enc.finish() {
                    body = z;
                    builder = builder.header("content-encoding", "gzip");
                }
            }
        }
        for (k, v) in &self.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let resp = match builder.body(body).send().await {
            Ok(r) => r,
            Err(e) => {
                let error = format!("POST {shown}: {}", error_chain(&e));
                return Outcome::Retry {
                    cut_off: cut_off(&error),
                    hint: None,
                    error,
                };
            }
        };
        let status = resp.status().as_u16();
        let hint = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = read_capped(resp, MAX_RESPONSE_BYTES).await;
        match status {
            300..=399 => Outcome::Refused {
                too_large: false,
                error: format!(
                    "POST {shown}: HTTP {status} redirect to {} not followed: only 307 and 308 redirects within the endpoint's own scheme, host and port are (a 301, 302 or 303 would resend the export as a GET without its body); set [forward] endpoint to where the upstream is",
                    location.as_deref().map(escape).unwrap_or_else(|| "(no Location)".into())
                ),
            },
            200..=299 => {
                let (rejected, message) = partial_http(signal, &bytes);
                Outcome::Accepted { rejected, message }
            }
            429 | 502 | 503 | 504 => Outcome::Retry {
                cut_off: false,
                hint,
                error: format!("POST {shown}: HTTP {status}"),
            },
            _ => Outcome::Refused {
                too_large: status == 413,
                error: format!(
                    "POST {shown}: HTTP {status}: {}",
                    escape(&String::from_utf8_lossy(&bytes[..bytes.len().min(300)]))
                ),
            },
        }
    }

    async fn export_grpc(&self, ch: Channel, req: Request) -> Outcome {
        let endpoint = self.shown[req.signal().index()].clone();
        let gzip = self.compression == Compression::Gzip;
        macro_rules! call {
            ($client:ident, $msg:expr, $rej:ident) => {{
                let mut c = $client::new(ch);
                if gzip {
                    c = c.send_compressed(CompressionEncoding::Gzip);
                }
                let mut r = tonic::Request::new($msg);
                r.set_timeout(self.timeout);
                for (k, v) in &self.headers {
                    if let (Ok(k), Ok(v)) = (
                        MetadataKey::from_bytes(k.as_bytes()),
                        MetadataValue::try_from(v.as_str()),
                    ) {
                        r.metadata_mut().insert(k, v);
                    }
                }
                c.export(r).await.map(|resp| {
                    let p = resp.into_inner().partial_success.unwrap_or_default();
                    (p.$rej.max(0) as u64, p.error_message)
                })
            }};
        }
        let result = match req {
            Request::Traces(m) => call!(TraceServiceClient, m, rejected_spans),
            Request::Logs(m) => call!(LogsServiceClient, m, rejected_log_records),
            Request::Metrics(m) => call!(MetricsServiceClient, m, rejected_data_points),
        };
        match result {
            Ok((rejected, message)) => Outcome::Accepted { rejected, message },
            Err(status) => classify_grpc(&status, &endpoint),
        }
    }
}

/// A lazily connecting gRPC channel to `url` (only its origin counts); `https://` uses
/// rustls with the web PKI roots plus `ca` (PEM).
fn grpc_channel(url: &str, timeout: Duration, ca: Option<&[u8]>) -> Result<Channel, ForwardError> {
    let named = redact_url(url);
    let bad = |message: String| ForwardError::Config {
        key: "endpoint",
        message,
    };
    let uri = http::Uri::try_from(url).map_err(|e| bad(format!("{named:?}: {e}")))?;
    let origin = match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(auth)) => format!("{scheme}://{auth}"),
        _ => return Err(bad(format!("{named:?} has no scheme or host"))),
    };
    let mut ep = Channel::from_shared(origin)
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    if uri.scheme_str() == Some("https") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
        if let Some(pem) = ca {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        if let Some(host) = uri.host() {
            tls = tls.domain_name(host.trim_start_matches('[').trim_end_matches(']'));
        }
        ep = ep.tls_config(tls).map_err(|e| ForwardError::Config {
            key: "ca_file",
            message: format!("TLS setup for {named:?}: {}", error_chain(&e)),
        })?;
    }
    Ok(ep.connect_lazy())
}

/// Most bytes of an upstream's answer read, bytes (64 KiB): an `ExportTraceServiceResponse`
/// carries a `partial_success` count and message, and an error page is shown by its first
/// 300 bytes. An upstream answering 800 MiB took the sidecar to 1.7 GB RSS.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The first `cap` bytes of `resp`'s body (what arrived before an error, if one came);
/// the rest is not read, and the connection is dropped with it.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < cap {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(cap - out.len());
                out.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    out
}

/// Most redirects followed for one export.
const MAX_REDIRECTS: usize = 5;

/// The forwarder follows a redirect only within the endpoint's origin (scheme, host and
/// port), at most [`MAX_REDIRECTS`] times. Why: `[forward.headers]` often carry the
/// upstream's credentials (`x-api-key`, a vendor token) that reqwest does not strip on a
/// cross-origin redirect, so following one sent them, and the telemetry, to whatever host
/// a `Location` named. Only 307 and 308 are followed: a client follows 301, 302 and 303
/// with a GET without the body (RFC 9110 §15.4), so the export would be lost while the
/// upstream answered 200 to an empty GET. A redirect not followed is answered as the 3xx it
/// is: refused, with the target named.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if same && keeps_body {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// Text from the upstream (an error body, a status message, a `Location`) as it may be
/// logged: control characters (a newline would start a forged log line) escaped as Rust
/// escapes them (`\n`, `\u{1b}`), everything else as is.
fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Whether a failed send reads as the connection cut off mid-request (reset, broken pipe,
/// closed before the answer): some servers refuse an over-size body that way, so a
/// smaller request may pass ([`Outcome::Retry`]'s `cut_off`).
fn cut_off(error: &str) -> bool {
    let lower = error.to_ascii_lowercase();
    lower.contains("reset") || lower.contains("broken pipe") || lower.contains("closed before")
}

/// The full error chain of a reqwest error (its `Display` hides "connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// `partial_success` of an HTTP answer body (protobuf).
fn partial_http(signal: Signal, body: &[u8]) -> (u64, String) {
    let p = match signal {
        Signal::Traces => ExportTraceServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_spans, p.error_message)),
        Signal::Logs => ExportLogsServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_log_records, p.error_message)),
        Signal::Metrics => ExportMetricsServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_data_points, p.error_message)),
    };
    p.map(|(n, m)| (n.max(0) as u64, m)).unwrap_or_default()
}

/// The RetryInfo delay inside a gRPC status's details, if any.
pub fn retry_info(details: &[u8]) -> Option<Duration> {
    let st = RpcStatus::decode(details).ok()?;
    st.details
        .iter()
        .filter(|d| d.type_url == RETRY_INFO_TYPE)
        .find_map(|d| RetryInfo::decode(d.value.as_slice()).ok()?.retry_delay)
        .map(|d| {
            Duration::new(
                d.seconds.max(0) as u64,
                d.nanos.clamp(0, 999_999_999) as u32,
            )
        })
}

/// OTLP/gRPC retryable codes: CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE,
/// UNAVAILABLE, DATA_LOSS; RESOURCE_EXHAUSTED only with RetryInfo. Others are permanent.
///
/// Those rules are for a status the upstream sent. A status tonic made from a failure of
/// the connection (it carries the transport error as its `source`: a reset, a closed
/// connection, an HTTP/2 protocol error from a port that does not speak it) is not an
/// answer: the upstream may never have seen the request, so it is retried like an HTTP
/// request that failed to send, whatever code tonic gave it (often UNKNOWN or INTERNAL).
fn classify_grpc(status: &tonic::Status, endpoint: &str) -> Outcome {
    if let Some(source) = std::error::Error::source(status) {
        let error = escape(&format!(
            "gRPC {endpoint}: {:?}: {}: {}",
            status.code(),
            status.message(),
            error_chain(source)
        ));
        return Outcome::Retry {
            cut_off: cut_off(&error),
            hint: None,
            error,
        };
    }
    let hint = retry_info(status.details());
    let error = format!(
        "gRPC {endpoint}: {:?}: {}",
        status.code(),
        escape(status.message())
    );
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Outcome::Retry {
            cut_off: false,
            hint,
            error,
        },
        Code::ResourceExhausted if hint.is_some() => Outcome::Retry {
            cut_off: false,
            hint,
            error,
        },
        Code::ResourceExhausted => Outcome::Refused {
            too_large: true,
            error,
        },
        _ => Outcome::Refused {
            too_large: false,
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use stallwatch_collector::rpc;

    /// An upstream's answer is read up to the cap and no further: the server sees the
    /// connection dropped long before its announced 1 GiB is sent.
    #[tokio::test]
    async fn an_answer_is_read_up_to_its_cap_only() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n")
                .await;
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0usize;
            while sent < 1 << 30 {
                if s.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let resp = reqwest::get(format!("http://{addr}/")).await.unwrap();
        let body = read_capped(resp, MAX_RESPONSE_BYTES).await;
        assert_eq!(body.len(), MAX_RESPONSE_BYTES);
        let sent = server.await.unwrap();
        assert!(sent < 256 << 20, "the whole answer was read: {sent} bytes");
    }

    #[test]
    fn grpc_codes_and_retry_info() {
        let details = rpc::status(14, "busy", Some(3)).encode_to_vec();
        let st = tonic::Status::with_details(Code::Unavailable, "busy", details.clone().into());
        assert_eq!(
            classify_grpc(&st, "e"),
            Outcome::Retry {
                cut_off: false,
                hint: Some(Duration::from_secs(3)),
                error: "gRPC e: Unavailable: busy".into()
            }
        );
        let st = tonic::Status::new(Code::ResourceExhausted, "too big");
        assert!(matches!(
            classify_grpc(&st, "e"),
            Outcome::Refused {
                too_large: true,
                ..
            }
        ));
        let st = tonic::Status::with_details(Code::ResourceExhausted, "slow", details.into());
        assert!(matches!(
            classify_grpc(&st, "e"),
            Outcome::Retry { hint: Some(_), .. }
        ));
        let st = tonic::Status::new(Code::InvalidArgument, "bad");
        assert!(matches!(
            classify_grpc(&st, "e"),
            Outcome::Refused {
                too_large: false,
                ..
            }
        ));
        // UNKNOWN or INTERNAL sent by the upstream is an answer: refused.
        for code in [Code::Unknown, Code::Internal] {
            assert!(matches!(
                classify_grpc(&tonic::Status::new(code, "x"), "e"),
                Outcome::Refused { .. }
            ));
        }
        // The same codes made by tonic from a failed connection are retried.
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let st = tonic::Status::from_error(Box::new(reset));
        assert_eq!(st.code(), Code::Unknown);
        assert!(matches!(
            classify_grpc(&st, "e"),
            Outcome::Retry { cut_off: true, .. }
        ));
    }

    /// A real gRPC call to a port that answers HTTP/1.1 (tonic: an HTTP/2 protocol error)
    /// is classified as retryable: the upstream never answered it.
    #[tokio::test]
    async fn a_grpc_call_to_a_port_that_is_not_grpc_is_retryable() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        let url = format!("http://{addr}");
        let ch = grpc_channel(&url, Duration::from_secs(5), None).unwrap();
        let status = TraceServiceClient::new(ch)
            .export(ExportTraceServiceRequest::default())
            .await
            .unwrap_err();
        assert!(
            matches!(classify_grpc(&status, &url), Outcome::Retry { .. }),
            "{status:?}"
        );
    }

    #[test]
    fn text_from_the_upstream_cannot_start_a_log_line() {
        assert_eq!(
            escape("bad\n2026-12-06T00:00:00Z INFO forged\u{1b}[0m"),
            "bad\\n2026-12-06T00:00:00Z INFO forged\\u{1b}[0m"
        );
        assert_eq!(escape("plain text"), "plain text");
    }
}

/// A `Retry-After` value as a wait from `now`: delta seconds or an HTTP-date (RFC 9110
/// section 10.2.3; a date in the past is no wait); `None` when unreadable.
pub(crate) fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod retry_after_tests {
    use super::*;

    #[test]
    fn seconds_and_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("later", now), None);
    }
}
