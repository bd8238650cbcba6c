//! Integration tests of the collector: a real `Collector` on port 0 with a real `Storage`
//! on a temporary SQLite file, driven over real sockets (reqwest for OTLP/HTTP, a raw h2
//! client for OTLP/gRPC). Regression tests are named after the case they come from
//! (`tests/data/cases/payloads/MANIFEST.json`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod cases;
mod cors;
mod grpc;
mod http;
mod parts;
