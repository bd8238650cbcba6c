//! stallwatch collector: OTLP in. gRPC (tonic transport, our own framing and codec so bad
//! input is `INVALID_ARGUMENT`) and HTTP (axum; protobuf and JSON), decompression capped at
//! the request limit, an in-flight byte budget, CORS, the optional ingest token, and one
//! decode layer from wire types to `stallwatch_storage::model` records.
//!
//! Flow per request: size-capped read → capped decompression → decode and validate →
//! `Storage::write_*` (resolves after COMMIT) → observation to the watchdog → answer.

mod chunks;
pub mod config;
mod cors;
pub mod decode;
mod decompress;
pub mod error;
mod grpc;
mod http;
mod ingest;
mod part_pool;
pub mod rpc;
mod server;
mod stats;

pub use config::{CollectorConfig, RawOtlpConfig};
pub use decompress::decompress_body;
pub use error::CollectorError;
pub use http::http_app;
pub use ingest::IngestState;
pub use server::Collector;
pub use stats::{IngestStats, RefuseReason};
