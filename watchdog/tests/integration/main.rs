//! The watchdog's integration tests: real SQLite files, real Python runner processes serving
//! real UNIX sockets, Observations built from the model types, scaled-down timings.
#![allow(clippy::unwrap_used)] // tests may unwrap (COMMON.md)

mod common;
mod heartbeats;
mod ledger;
mod scale;
mod verdicts;
