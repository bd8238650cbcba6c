//! The watchdog's integration tests: real SQLite files, real Python runner processes serving
//! real UNIX sockets, Observations built from the model types, scaled-down timings.

mod common;
mod heartbeats;
mod ledger;
mod verdicts;
