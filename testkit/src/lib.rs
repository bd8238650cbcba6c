//! Test helpers written once for every stallwatch test target and bench (dev-only, never
//! published): start `stallwatch serve` on port 0 and read its ready line ([`server`]),
//! register runners and wait on the API ([`runners`]), JSON and file helpers ([`json`],
//! [`files`]), the WebDriver harness for real Chromium ([`webdriver`]), and the rule for
//! tests that need a tool or root ([`require`]): in CI (`CI` set) a missing tool fails the
//! test; elsewhere the test says it is skipped and why, never passing silently.
//!
//! `tests/support.rs` re-exports these under the names the whole-system tests have always
//! used.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod files;
pub mod json;
pub mod runners;
pub mod server;
pub mod webdriver;

pub use files::{count_files, stage_files};
pub use json::{attr, nanos, span_named, unix_nanos};
pub use runners::{
    incidents, post_json, process_alive, runner, spawn_runner, wait_incident, wait_lifecycle,
};
pub use server::{http_client, read_ready_line, stallwatch_bin, Server, ServerOpts};
pub use webdriver::{find_binary, Driver, PAGE_WAIT};

/// Polls `cond` every 50 ms until it is true or `timeout` passes; panics with `what`.
#[macro_export]
macro_rules! wait_until {
    ($timeout:expr, $what:expr, $cond:expr) => {{
        let deadline = std::time::Instant::now() + $timeout;
        loop {
            if $cond {
                break;
            }
            if std::time::Instant::now() > deadline {
                panic!("timed out waiting for {}", $what);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }};
}

/// Whether a test that needs something this machine may lack (root, a tool) can run.
/// `available` false: with `CI` set the test fails naming `what` (CI installs every tool
/// and runs as root, so a lack there is a broken set-up, not a skip); elsewhere it prints
/// `skipped: <what>` on stderr and answers false so the test returns early.
pub fn require(available: bool, what: &str) -> bool {
    if available {
        return true;
    }
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{what} (CI is set: a missing tool or privilege fails here, never skips)");
    }
    eprintln!("skipped: {what}");
    false
}
