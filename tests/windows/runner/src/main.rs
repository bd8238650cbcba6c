//! A Windows test runner for the Wine tests (scripts/test-windows, tests/windows.rs).
//!
//! `windows-runner <mode> <marker dir>`. It serves the heartbeat named pipe named by
//! `STALLWATCH_HEARTBEAT_SOCKET` with the real protocol (`PING\n` → `PONG\n`) and writes
//! `<dir>/<mode>.pid` with its pid at start; spawned with a workspace, it also stages
//! `runner.json` (`{"mode", "checkpoint"}`) in `STALLWATCH_CHECKPOINT_DIR`. Modes:
//! - `healthy`: answers every ping; exits 0 on `CTRL_BREAK_EVENT`, writing `<dir>/break`;
//! - `deadlock`: answers for `STALL_AFTER_MS` (default 1000 ms), then stops answering (its
//!   pipe still accepts, as a process whose heartbeat thread is stuck on a lock); exits 0
//!   on the break like `healthy`;
//! - `ignore-break`: `deadlock`, and swallows `CTRL_BREAK_EVENT` (writes `<dir>/break`
//!   and keeps running), so only `TerminateJobObject` ends it;
//! - `escape`: `ignore-break`, and starts `windows-runner child <dir>` detached in its own
//!   process group (`DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP`, asking for
//!   `CREATE_BREAKAWAY_FROM_JOB` first), writing `<dir>/child.pid`: a child that escaped its
//!   parent's console and group, but not its job;
//! - `child`: sleeps forever, ignoring the break.
#![allow(clippy::unwrap_used)]

#[cfg(windows)]
mod win;

#[cfg(windows)]
fn main() {
    win::main();
}

#[cfg(not(windows))]
fn main() {
    eprintln!("windows-runner is a Windows test fixture: build it for x86_64-pc-windows-gnu (scripts/test-windows)");
    std::process::exit(2);
}
