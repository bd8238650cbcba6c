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
    wait_until!(
        Duration::from_secs(30),
        "the sweep re-adopts the sleeper",
        {
            let (st, v) = server.get_json("/api/v1/runners/sleeper");
            st == 200 && v["pid"].as_u64() == Some(pid) && v["spawned"] == false
        }
    );
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

/// Replacing a checkpoint's staging folder by a symlink to a folder outside the workspace
/// must not move that folder's files into the workspace (it used to answer 200 {"files":1}
/// and move them); a checkpoint for an unregistered runner is a 404.
#[test]
fn a_symlinked_staging_folder_is_refused_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let ws = dir.path().join("ws");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "s").unwrap();

    let (st, v) = crate::chain::post_json(
        &server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": "nobody", "workspace": ws}),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("runner_not_found")),
        "{v}"
    );

    spawn_runner(&server, "holder", &["sleep", "600"], None, &[]);
    let (st, cp) = crate::chain::post_json(
        &server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": "holder", "workspace": ws}),
    );
    assert!(st == 200 || st == 201, "{st} {cp}");
    let staging = std::path::PathBuf::from(cp["path"].as_str().unwrap());
    std::fs::remove_dir(&staging).unwrap();
    std::os::unix::fs::symlink(&outside, &staging).unwrap();
    let id = cp["id"].as_str().unwrap();
    for action in ["commit", "rollback"] {
        let (st, v) = crate::chain::post_json(
            &server,
            &format!("/api/v1/checkpoints/{id}/{action}"),
            &serde_json::json!({}),
        );
        assert_eq!(st, 400, "{action}: {v}");
        assert_eq!(v["error"]["code"], "path_escape", "{action}: {v}");
        assert!(outside.join("secret.txt").exists(), "{action}");
        assert!(!ws.join("secret.txt").exists(), "{action}");
    }
    server.stop();
}
