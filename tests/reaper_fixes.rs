//! Regressions found in the reaper by a new user, checked end to end on the real binary.

use std::time::Duration;

use crate::chain::{process_alive, spawn_runner};
use crate::support::Server;

/// A runner spawned through the API, left running by a kill -9 of stallwatch, is re-adopted
/// by the next run's orphan sweep and still stopped at that run's shutdown (it used to be
/// left running, re-parented to pid 1).
#[test]
fn a_spawned_runner_readopted_after_a_crash_is_stopped_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let reg = spawn_runner(&server, "sleeper", &["sleep", "600"], None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    assert!(process_alive(pid));
    server.crash();
    assert!(process_alive(pid), "a crash does not stop the runner");

    let server = Server::start(&data);
    wait_until!(Duration::from_secs(30), "the sweep re-adopts the sleeper", {
        let (st, v) = server.get_json("/api/v1/runners/sleeper");
        st == 200 && v["pid"].as_u64() == Some(pid) && v["spawned"] == false
    });
    assert!(process_alive(pid));
    let stderr_path = server.stderr_path.clone();
    server.stop();
    wait_until!(
        Duration::from_secs(20),
        format!(
            "adopted sleeper {pid} stopped at shutdown; stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        ),
        !process_alive(pid)
    );
}
