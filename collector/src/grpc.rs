//! OTLP/gRPC: `TraceService/Export`, `LogsService/Export`, `MetricsService/Export`, served
//! by tonic's transport with our own framing and codec instead of tonic's `ProstCodec`.
//!
//! Why: tonic's codec answers `OUT_OF_RANGE` for an over-size message and `INTERNAL` for a
//! body it cannot decode or decompress, while docs/design.md ("Back-pressure and limits") wants
//! `INVALID_ARGUMENT` naming the problem for bad input, `RESOURCE_EXHAUSTED` (no RetryInfo)
//! for over-size, and `UNAVAILABLE` + RetryInfo for back-pressure. So this service reads
//! the one length-prefixed message itself (capped at `max_request_bytes` before it is
//! buffered), decompresses `grpc-encoding` gzip/deflate/zstd through the capped reader,
//! decodes with prost into opentelemetry-proto types, and shares the ingest pipeline.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::StreamBody;
use hyper::body::Frame;
use prost::Message;
use tonic::body::Body;
use tonic::{Code, Status};

use crate::decode::Format;
use crate::decompress::Coding;
use crate::ingest::{IngestState, Refusal, Signal};
use crate::rpc;
use crate::stats::RefuseReason;

/// gRPC path of the trace export.
pub(crate) const TRACE_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// gRPC path of the logs export.
pub(crate) const LOGS_EXPORT: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
/// gRPC path of the metrics export.
pub(crate) const METRICS_EXPORT: &str =
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
/// Codings we accept in `grpc-encoding`.
const ACCEPT_ENCODING: &str = "identity,gzip,deflate,zstd";
/// Length-prefixed message header: 1 flag byte + 4 length bytes.
const FRAME_HEADER: usize = 5;

/// The OTLP gRPC services as one tower service (routing by path).
#[derive(Clone)]
pub(crate) struct GrpcService {
    state: IngestState,
    /// The OTLP/HTTP address, named in the answer to an HTTP/1.1 request.
    http_addr: std::net::SocketAddr,
}

impl GrpcService {
    pub(crate) fn new(state: IngestState, http_addr: std::net::SocketAddr) -> Self {
        Self { state, http_addr }
    }
}

/// HTTP 415 for an HTTP/1.x request on the gRPC port, in plain text, naming the OTLP/HTTP
/// address (OTLP specification, "OTLP/HTTP": that is where `http/protobuf` and `http/json`
/// exporters belong).
fn http1_answer(state: &IngestState, http_addr: std::net::SocketAddr) -> Response<Body> {
    state
        .inner
        .stats
        .refuse_request(RefuseReason::UnsupportedMediaType);
    let text = format!(
        "this is the OTLP/gRPC port (HTTP/2 only); send OTLP/HTTP (http/protobuf, http/json) to http://{http_addr}/v1/traces, /v1/logs or /v1/metrics\n"
    );
    let mut resp = Response::new(Body::new(http_body_util::Full::new(Bytes::from(text))));
    *resp.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// HTTP 421 in plain text for an HTTP/1.x request on the gRPC port naming a foreign `Host`.
fn misdirected(host: &str) -> Response<Body> {
    let text = format!("{}\n", stallwatch_storage::hosts::refusal_message(host));
    let mut resp = Response::new(Body::new(http_body_util::Full::new(Bytes::from(text))));
    *resp.status_mut() = http::StatusCode::MISDIRECTED_REQUEST;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

impl tower::Service<Request<Body>> for GrpcService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let state = self.state.clone();
        if req.version() < http::Version::HTTP_2 {
            // The Host rule first, as on every listener: the hint names the OTLP/HTTP port.
            let resp = match state.foreign_host(req.version(), req.uri(), req.headers()) {
                Some(host) => misdirected(&host),
                None => http1_answer(&state, self.http_addr),
            };
            return Box::pin(async move { Ok(resp) });
        }
        Box::pin(async move { Ok(handle(state, req).await) })
    }
}

/// The gRPC status for a refusal (docs/design.md: back-pressure → `UNAVAILABLE` with RetryInfo;
/// over-size → `RESOURCE_EXHAUSTED` without; bad input → `INVALID_ARGUMENT`).
pub(crate) fn refusal_status(r: &Refusal) -> Status {
    let msg = r.message();
    match r {
        Refusal::BadRequest(_) | Refusal::TooSlow(_) | Refusal::UnsupportedMediaType(_) => {
            Status::invalid_argument(msg)
        }
        Refusal::TooLarge(_) => Status::resource_exhausted(msg),
        Refusal::UnsupportedEncoding(_) => Status::unimplemented(msg),
        Refusal::Unauthenticated => Status::unauthenticated(msg),
        Refusal::Busy { retry_after_s, .. } => {
            let details = rpc::status(
                Code::Unavailable as i32,
                &msg,
                Some((*retry_after_s).max(1)),
            );
            Status::with_details(Code::Unavailable, msg, Bytes::from(details.encode_to_vec()))
        }
        Refusal::Internal(_) => Status::internal(msg),
    }
}

fn status_response(status: Status) -> Response<Body> {
    let mut resp = status.into_http::<Body>();
    resp.headers_mut().insert(
        "grpc-accept-encoding",
        HeaderValue::from_static(ACCEPT_ENCODING),
    );
    resp
}

fn refuse(state: &IngestState, r: Refusal) -> Response<Body> {
    state.refused(&r);
    status_response(refusal_status(&r))
}

fn ok_response(message: Vec<u8>) -> Response<Body> {
    let mut frame = BytesMut::with_capacity(FRAME_HEADER + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = futures::stream::iter([
        Ok::<_, Infallible>(Frame::data(frame.freeze())),
        Ok(Frame::trailers(trailers)),
    ]);
    let mut resp = Response::new(Body::new(StreamBody::new(frames)));
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static(ACCEPT_ENCODING),
    );
    resp
}

async fn handle(state: IngestState, req: Request<Body>) -> Response<Body> {
    let received = Instant::now();
    if let Some(host) = state.foreign_host(req.version(), req.uri(), req.headers()) {
        return status_response(Status::permission_denied(
            stallwatch_storage::hosts::refusal_message(&host),
        ));
    }
    let signal = match req.uri().path() {
        TRACE_EXPORT => Signal::Traces,
        LOGS_EXPORT => Signal::Logs,
        METRICS_EXPORT => Signal::Metrics,
        other => {
            state.inner.stats.refuse_request(RefuseReason::NotFound);
            return status_response(Status::unimplemented(format!(
                "unknown method {other}: this server implements the OTLP Trace, Logs and Metrics Export services"
            )));
        }
    };
    let headers = req.headers();
    if !state.authorized(
        headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
    ) {
        return refuse(&state, Refusal::Unauthenticated);
    }
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !(ct == "application/grpc"
        || ct.starts_with("application/grpc+proto")
        || ct.starts_with("application/grpc;"))
    {
        return refuse(
            &state,
            Refusal::UnsupportedMediaType(format!(
                "unsupported content-type {ct:?}: use application/grpc (protobuf)"
            )),
        );
    }
    let coding = match headers
        .get("grpc-encoding")
        .map(|v| v.to_str().map(Coding::parse))
    {
        None => Coding::Identity,
        Some(Ok(Some(c))) => c,
        _ => {
            return refuse(
                &state,
                Refusal::UnsupportedEncoding(format!(
                    "unsupported grpc-encoding {:?}: use {ACCEPT_ENCODING}",
                    headers
                        .get("grpc-encoding")
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default()
                )),
            )
        }
    };
    let limit = state.inner.max_request_bytes;
    let mut charge = state.inner.budget.charge();
    // Counted from here, body reading included: decoding in parts waits for free cores.
    let _in_pipeline = state.inner.decode_threads.enter();
    let mut body = req.into_body();
    let mut buf = BytesMut::new();
    let mut declared: Option<(u8, usize)> = None;
    loop {
        let next = match state.next_frame(&mut body).await {
            Ok(n) => n,
            Err(r) => return refuse(&state, r),
        };
        match next {
            None => break,
            Some(Err(e)) => {
                let r = match stallwatch_storage::listen::too_slow(&e) {
                    Some(t) => Refusal::TooSlow(t.to_string()),
                    None => {
                        Refusal::BadRequest(format!("cannot read request stream: {}", e.message()))
                    }
                };
                return refuse(&state, r);
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buf.extend_from_slice(&data);
                if declared.is_none() && buf.len() >= FRAME_HEADER {
                    let flag = buf[0];
                    let len = (&buf[1..FRAME_HEADER]).get_u32() as usize;
                    if len > limit {
                        return refuse(
                            &state,
                            Refusal::TooLarge(format!(
                                "message of {len} bytes exceeds max_request_bytes ({limit})"
                            )),
                        );
                    }
                    if let Err(r) = charge.grow(len + FRAME_HEADER) {
                        return refuse(&state, r);
                    }
                    // Uncompressed: its decode-time memory is known now, so a concurrent
                    // export that cannot be decoded is refused before its body is read.
                    if flag == 0 {
                        if let Err(r) = charge.grow_for_decode(len, signal, Format::Protobuf) {
                            return refuse(&state, r);
                        }
                    }
                    declared = Some((flag, len));
                    // One allocation for the whole message instead of doubling copies.
                    buf.reserve((FRAME_HEADER + len).saturating_sub(buf.len()));
                }
                if let Some((_, len)) = declared {
                    if buf.len() > FRAME_HEADER + len {
                        return refuse(
                            &state,
                            Refusal::BadRequest(
                                "unary Export call carried more than one message".into(),
                            ),
                        );
                    }
                }
            }
        }
    }
    state.inner.stats.request(true, buf.len());
    let Some((flag, len)) = declared else {
        return refuse(
            &state,
            Refusal::BadRequest(if buf.is_empty() {
                "request carried no message".into()
            } else {
                format!("truncated gRPC message header ({} of 5 bytes)", buf.len())
            }),
        );
    };
    if buf.len() < FRAME_HEADER + len {
        return refuse(
            &state,
            Refusal::BadRequest(format!(
                "truncated gRPC message: header says {len} bytes, got {}",
                buf.len() - FRAME_HEADER
            )),
        );
    }
    let codings = match (flag, coding) {
        (0, _) => vec![],
        (1, Coding::Identity) => {
            return refuse(
                &state,
                Refusal::BadRequest(
                    "message has the compressed flag but no grpc-encoding was sent".into(),
                ),
            )
        }
        (1, c) => vec![c],
        (f, _) => {
            return refuse(
                &state,
                Refusal::BadRequest(format!("invalid gRPC compressed flag {f} (want 0 or 1)")),
            )
        }
    };
    let message = buf.split_off(FRAME_HEADER).freeze();
    match state
        .process(signal, Format::Protobuf, codings, message, charge, received)
        .await
    {
        Ok(a) => ok_response(rpc::encode_export_response(
            Format::Protobuf,
            signal,
            a.rejected,
            &a.message,
        )),
        Err(r) => status_response(refusal_status(&r)),
    }
}
