//! `stallwatch-mcp`: `stallwatch mcp wrap -- <server argv>`, a transparent stdio proxy in
//! front of any MCP server (docs/design.md, Interfaces: MCP).
//!
//! The client runs the wrapper in place of the server command. The wrapper spawns the
//! server in its own process group and relays newline-delimited JSON-RPC messages both ways
//! byte for byte (MCP spec, Transports: stdio), and meanwhile:
//! - registers the server with the running sidecar (found through `<data_dir>/ready.json`)
//!   as an attached runner stallwatch may signal ([`sidecar`]);
//! - traces every request per the OpenTelemetry MCP semantic conventions, a `tools/call` as
//!   an open span at once and ended at its response ([`spans`]);
//! - takes each tool's SLA from `_meta["dev.stallwatch/sla_ms"]` in `tools/list` results;
//! - serves the runner's heartbeat socket, answering `PONG` only while the server answers the
//!   wrapper's own MCP `ping` requests ([`heartbeat`]);
//! - on a trip answers every in-flight request at once with JSON-RPC error
//!   [`TRIPPED_ERROR_CODE`], refuses new `tools/call` while the breaker is OPEN or
//!   HALF_OPEN, restarts the server (at most 3 times in 60 s) and replays the client's
//!   `initialize` ([`proxy`]).
//!
//! The wrapper talks to the sidecar only through its public HTTP API and OTLP/HTTP.

pub mod config;
pub mod error;
pub mod heartbeat;
pub mod jsonrpc;
pub mod proxy;
pub mod sidecar;
pub mod spans;

pub use config::{default_runner_id, WrapConfig, SLA_META_KEY};
pub use error::Error;
pub use proxy::{wrap, TRIPPED_ERROR_CODE};
