//! Whole-system tests of the `stallwatch` binary: real processes, real sockets, a real
//! SQLite file, real OpenTelemetry SDK exporters. One test target; a module per concern.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[macro_use]
#[allow(dead_code)] // shared helpers; not every module uses every one
mod support;

mod browser;
mod chain;
mod cli;
mod client;
mod crash;
mod demo;
mod exporters;
mod faults;
mod forensics;
mod forward;
mod lifecycle;
mod mcp;
mod mcp_wrap;
mod memory;
mod metrics;
mod openspans;
mod readback;
mod reaper_fixes;
mod reaper_safety;
mod shapes;
mod spine;
mod windows;
