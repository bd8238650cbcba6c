//! Integration tests of the dashboard: real SQLite files, real sockets on port 0, a real
//! headless Chromium. One target, one module per concern.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod api;
mod browser;
mod control;
mod sse;
mod webhooks;
